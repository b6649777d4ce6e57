//! The lock calls of a [`Client`]: taking a lock (through the local
//! table first), releasing, testing, and the DLM's unlock and convert.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use interlock_core::{Effect, Mode, Outcome};
use interlock_proto::{ConflictInfo, GrantInfo, Kind, Op, Reply};
use tokio::sync::oneshot;

use crate::dlm::{At, DlmLock};
use crate::guard::{LocalWait, WaitGuard};
use crate::spec::{core_kind, local_owner};
use crate::tables::Submitted;
use crate::{Client, ClientError, Inner, LockSpec};

impl Client {
    /// Takes a lock, waiting as long as it takes. Dropping the future
    /// withdraws the request.
    pub async fn lock(&self, spec: &LockSpec) -> Result<GrantInfo, ClientError> {
        self.acquire(spec, true, None).await?.ok_or(ClientError::Server("a blocking request was refused".into()))
    }

    /// Takes a lock if it is free now; `None` if it is not.
    pub async fn try_lock(&self, spec: &LockSpec) -> Result<Option<GrantInfo>, ClientError> {
        self.acquire(spec, false, None).await
    }

    /// Takes a lock (waiting for it if `wait`) by `deadline`: `None` if it
    /// was held by others until then (or, without `wait`, now). If the
    /// server has not answered by then, [`ClientError::Timeout`]: a slow
    /// server is not a held lock. The request is withdrawn either way.
    pub async fn lock_by(
        &self,
        spec: &LockSpec,
        wait: bool,
        deadline: Instant,
    ) -> Result<Option<GrantInfo>, ClientError> {
        self.acquire(spec, wait, Some(deadline)).await
    }

    /// Whether the local table mirrors this client's locks.
    fn local_table(&self) -> bool {
        !self.inner.options.no_local
    }

    async fn acquire(
        &self,
        spec: &LockSpec,
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<Option<GrantInfo>, ClientError> {
        spec.check()?;
        let local = spec.local() && self.local_table();
        if local {
            // A flock conversion drops the old lock first, as Linux does
            // (flock(2): conversion is not atomic), whatever becomes of
            // the new request: at the server too, before the local table
            // may refuse the request or hold it back, so that the two never
            // disagree on what the owner holds (the server's engine would
            // drop it only once the request reached it).
            if spec.kind == Kind::Flock
                && self
                    .inner
                    .local
                    .flock_mode(&spec.resource, spec.local_owner())
                    .is_ok_and(|held| held.is_some_and(|m| m != spec.mode))
            {
                self.unlock(spec).await?;
            }
            let range = spec.range;
            let conflict = self
                .inner
                .local
                .test(&spec.resource, spec.local_owner(), spec.core_kind(), spec.mode, range)
                .map_err(|e| ClientError::Invalid(e.to_string()))?;
            if conflict.is_some() {
                if !wait {
                    return Ok(None);
                }
                // Wait here, behind the other local owner, without asking
                // the server anything; but a POSIX wait, the one kind
                // with deadlock detection, waits in the server's queue,
                // whose waits-for graph sees every wait. Held here, it
                // would be an edge no graph holds, and a cycle through it
                // and the server's waits would wait for ever where Linux
                // answers `EDEADLK`.
                if spec.kind != Kind::Posix {
                    match within(deadline, self.wait_locally(spec)).await {
                        Some(r) => r?,
                        None => return Ok(None),
                    }
                }
            }
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let op = Op::Lock { target: spec.target(), mode: spec.mode as u8, wait, reclaim: false };
        let sent = self.inner.submit(id, op, wait, self.fence)?;
        let mut generation = sent.generation;
        let mut guard = WaitGuard::new(&self.inner, id, sent);
        let blocking = guard.grant_rx.is_some();
        let reply = match within(deadline, &mut guard.reply_rx).await {
            Some(Ok(Ok(r))) => r,
            // Never read (the server stopped cleanly first): nothing to
            // withdraw. Never so for a wait, which is sent again.
            Some(Ok(Err(unread))) => {
                guard.done();
                return Err(unread.into());
            }
            // The session changed before the reply came: a blocking
            // request is sent again in the new one (its answer comes
            // through `grant_rx`), any other failed.
            Some(Err(_)) if blocking => Reply::Queued,
            Some(Err(_)) => return Err(ClientError::ConnectionLost),
            None => return Err(ClientError::Timeout("the server did not answer the lock request in time".into())),
        };
        // A wait's answer through `grant_rx` may still come: the wait is
        // sent again in each new session until then.
        let mut again = blocking;
        let mut reply = reply;
        let reply = loop {
            if let (Reply::Queued, Some(grant_rx)) = (&reply, guard.grant_rx.as_mut().filter(|_| again)) {
                again = false;
                match within(deadline, grant_rx).await {
                    Some(a) => {
                        let a = a.map_err(|_| ClientError::ConnectionLost)?;
                        generation = a.generation;
                        reply = a.reply;
                    }
                    // Held by others until the deadline.
                    None => return Ok(None),
                }
            }
            let Reply::Granted(mut g) = reply else { break reply };
            match self.record(spec, &g, local, generation) {
                // Granted in a session lost before it was recorded (the
                // server died as it answered): the wait was sent again in
                // the new session, whose answer counts. Until session 52
                // the caller was told the lock was lost, and the new
                // session's grant, which no one awaited, left the lock
                // held by the session.
                Err(ClientError::LockLost) if again => reply = Reply::Queued,
                handle => {
                    guard.done();
                    g.handle = handle?;
                    return Ok(Some(g));
                }
            }
        };
        guard.done();
        match reply {
            Reply::WouldBlock => Ok(None),
            Reply::Deadlock => Err(ClientError::Deadlock),
            Reply::Error(e) => Err(ClientError::Server(e)),
            Reply::Limit(e) => Err(ClientError::Limit(e)),
            Reply::Recovering { left_ms } => Err(ClientError::Recovering(Duration::from_millis(left_ms))),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// Queues `spec` in the local table and waits until no other local
    /// owner holds what it wants. The local grant is given back at once:
    /// from here the request waits in the server's queue, and a local
    /// owner still waiting there must not hold back the other local owners
    /// (they would join the server's queue a whole rotation late).
    async fn wait_locally(&self, spec: &LockSpec) -> Result<(), ClientError> {
        let (tx, rx) = oneshot::channel();
        let resp = self.inner.local.lock(&spec.local_request(true)).map_err(|e| ClientError::Invalid(e.to_string()))?;
        match resp.outcome {
            Outcome::Queued(w) => {
                self.inner.tables.lock().local_waits.insert(w, tx);
                let mut guard = LocalWait { inner: self.inner.clone(), spec: spec.clone(), wait: Some(w) };
                local_effects(&self.inner, resp.effects);
                rx.await.map_err(|_| ClientError::ConnectionLost)?;
                guard.wait = None;
                Ok(())
            }
            Outcome::Granted(_) => {
                local_effects(&self.inner, resp.effects);
                drop(LocalWait { inner: self.inner.clone(), spec: spec.clone(), wait: None });
                Ok(())
            }
            Outcome::Deadlock => Err(ClientError::Deadlock),
            other => Err(ClientError::Server(format!("local table: {other:?}"))),
        }
    }

    /// Mirrors a grant made in session `generation` into the client's
    /// tables; if the session has changed since, the lock was lost with it
    /// (its lease ran out): [`ClientError::LockLost`]. Under the tables'
    /// lock, as the loss of a session is, so a grant is either recorded
    /// before a loss (and reported lost with the rest) or refused here.
    /// Returns a DLM lock's name (see `dlm`).
    fn record(
        &self,
        spec: &LockSpec,
        grant: &GrantInfo,
        local: bool,
        generation: u64,
    ) -> Result<Option<u64>, ClientError> {
        let mut t = self.inner.tables.lock();
        if self.inner.generation.load(Ordering::Relaxed) != generation {
            return Err(ClientError::LockLost);
        }
        let mut effects = Vec::new();
        if local {
            if let Ok(resp) = self.inner.local.lock(&spec.local_request(false)) {
                effects = resp.effects;
            }
            t.local_resources.insert((spec.kind, spec.resource.clone()));
        }
        let name = grant.handle.map(|server| {
            let lock = DlmLock {
                resource: spec.resource.clone(),
                owner: spec.owner,
                mode: spec.mode as u8,
                start: spec.range.start(),
                end: spec.range.end(),
                at: At::Held(server),
            };
            let name = t.dlm.insert(server, lock);
            (name, t.dlm.overtaken(server, name))
        });
        drop(t);
        local_effects(&self.inner, effects);
        let Some((name, overtaken)) = name else { return Ok(None) };
        if let Some(tx) = self.inner.blocking.lock().as_ref() {
            for b in overtaken {
                let _ = tx.send(b);
            }
        }
        Ok(Some(name))
    }

    /// Releases `spec.range` of the owner (POSIX, OFD, flock). Sent at
    /// once; local waiters it frees go on to the server right away.
    pub async fn unlock(&self, spec: &LockSpec) -> Result<(), ClientError> {
        if spec.kind == Kind::Dlm {
            return Err(ClientError::Invalid("DLM locks are released with dlm_unlock".into()));
        }
        spec.check()?;
        let reply = self.request(Op::Unlock { target: spec.target() });
        if self.local_table() {
            let (owner, kind) = (spec.local_owner(), spec.core_kind());
            if let Ok(resp) = self.inner.local.unlock(&spec.resource, owner, kind, spec.range) {
                local_effects(&self.inner, resp.effects);
            }
            self.forget_if_free(spec.kind, &spec.resource);
        }
        reply.await.map(drop)
    }

    /// Drops `resource` from the resources to reclaim once no local owner
    /// holds a lock there, so a long-lived client that locks many names
    /// does not keep them all. Checked under the tables' lock, which a
    /// new local grant takes after it is in the local table, so a racing
    /// grant is never dropped.
    fn forget_if_free(&self, kind: Kind, resource: &[u8]) {
        let mut t = self.inner.tables.lock();
        if self.inner.local.lock_count(resource, core_kind(kind).namespace()).is_ok_and(|n| n == 0) {
            t.local_resources.remove(&(kind, resource.to_vec()));
        }
    }

    /// Releases every lock of the owner on the resource (a close).
    pub async fn close(&self, resource: &[u8], kind: Kind, owner: u32) -> Result<(), ClientError> {
        let reply = self.request(Op::Close { resource: resource.to_vec(), kind, owner });
        if self.local_table() {
            if let Ok(resp) = self.inner.local.release_owner(resource, local_owner(kind, owner), core_kind(kind)) {
                local_effects(&self.inner, resp.effects);
            }
            self.forget_if_free(kind, resource);
        }
        reply.await.map(drop)
    }

    /// `F_GETLK` at the server.
    pub async fn test(&self, spec: &LockSpec) -> Result<Option<ConflictInfo>, ClientError> {
        spec.check()?;
        match self.request(Op::Test { target: spec.target(), mode: spec.mode as u8 }).await? {
            Reply::Conflict(c) => Ok(c),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// Sends request `id`, `op` on the server's handle for the caller's
    /// DLM lock `handle` of `owner` on `resource`, once that lock's
    /// reclaim (if one is on its way) is answered. Under the tables' lock,
    /// which a new session takes to mark the locks it reclaims, so the
    /// request names the lock as the server it reaches knows it, or goes
    /// nowhere. An unlock (`take`) takes the lock out of the table as it
    /// goes. Refused if this client holds no such lock (never granted,
    /// unlocked, or lost).
    async fn send_on_dlm_lock(
        &self,
        (resource, owner, handle): (&[u8], u32, u64),
        id: u64,
        take: bool,
        wait: bool,
        op: impl Fn(u64) -> Op,
    ) -> Result<Submitted, ClientError> {
        loop {
            let answered = self.inner.reclaim_answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            {
                let mut t = self.inner.tables.lock();
                let at = t.dlm.get(handle).filter(|l| l.resource == resource && l.owner == owner).map(|l| l.at);
                match at {
                    None => {
                        return Err(ClientError::Invalid(format!(
                            "this client holds no DLM lock {handle} of owner {owner} on this resource"
                        )));
                    }
                    Some(At::Held(server)) => {
                        self.inner.fenced(self.fence)?;
                        if take {
                            t.dlm.remove(handle);
                        }
                        return self.inner.submit_listed(&mut t, id, op(server), wait);
                    }
                    Some(At::Reclaiming { .. }) => {}
                }
            }
            answered.await;
        }
    }

    /// Releases a DLM lock, storing `lvb` if it was held PW or EX. The
    /// lock leaves the client's table as the request goes, so its handle
    /// may name a later lock.
    pub async fn dlm_unlock(
        &self,
        resource: &[u8],
        owner: u32,
        handle: u64,
        lvb: Option<Vec<u8>>,
    ) -> Result<(), ClientError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let op = |handle| Op::DlmUnlock { resource: resource.to_vec(), owner, handle, lvb: lvb.clone() };
        let sent = self.send_on_dlm_lock((resource, owner, handle), id, true, false, op).await?;
        self.answer(id, sent).await.map(drop)
    }

    /// Converts a DLM lock; `None` if `wait` is false and it would block.
    pub async fn convert(
        &self,
        resource: &[u8],
        owner: u32,
        handle: u64,
        mode: Mode,
        wait: bool,
    ) -> Result<Option<GrantInfo>, ClientError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let op =
            |handle| Op::DlmConvert { resource: resource.to_vec(), owner, handle, mode: mode as u8, wait, lvb: None };
        let sent = self.send_on_dlm_lock((resource, owner, handle), id, false, wait, op).await?;
        // Dropped before its answer, the convert is withdrawn, and a grant
        // that raced the drop is given back (`give_back`).
        let mut guard = WaitGuard::new(&self.inner, id, sent);
        let reply = match (&mut guard.reply_rx).await {
            Ok(Ok(r)) => Ok(r),
            // Never read: no effect (a wait is sent again instead).
            Ok(Err(unread)) => Err(unread.into()),
            // The session changed first: a wait was sent again in the new
            // one, and its answer comes through `grant_rx`.
            Err(_) if wait => Ok(Reply::Queued),
            Err(_) => Err(ClientError::ConnectionLost),
        };
        let reply = match (reply, guard.grant_rx.as_mut()) {
            (Ok(Reply::Queued), Some(grant_rx)) => {
                grant_rx.await.map(|a| a.reply).map_err(|_| ClientError::ConnectionLost)
            }
            (reply, _) => reply,
        };
        guard.done();
        let out = match reply {
            Ok(Reply::Granted(g)) => Ok(Some(GrantInfo { handle: Some(handle), ..g })),
            Ok(Reply::WouldBlock) => Ok(None),
            Ok(Reply::Deadlock) => Err(ClientError::Deadlock),
            Ok(Reply::Error(e)) => Err(ClientError::Server(e)),
            Ok(Reply::Recovering { left_ms }) => Err(ClientError::Recovering(Duration::from_millis(left_ms))),
            Ok(other) => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
            Err(e) => Err(e),
        };
        if let Ok(Some(_)) = &out {
            self.inner.tables.lock().dlm.set_mode(handle, mode as u8);
        }
        out
    }
}

/// Wakes local waiters that the local table granted.
pub(crate) fn local_effects(inner: &Inner, effects: Vec<Effect>) {
    for e in effects {
        if let Effect::Granted { wait, .. } = e
            && let Some(tx) = inner.tables.lock().local_waits.remove(&wait)
        {
            let _ = tx.send(());
        }
    }
}

/// `f`'s output, or `None` if `deadline` passes first. Without a deadline
/// `f` is awaited as it is: the common, untimed lock pays for no timer.
async fn within<F: std::future::Future>(deadline: Option<Instant>, f: F) -> Option<F::Output> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), f).await.ok(),
        None => Some(f.await),
    }
}
