//! A lock as the caller names it, and its forms for the server and the
//! local table.

use interlock_core::{LockKind, LockRequest, Mode, Range};
use interlock_proto::{Kind, Target, owner};

use crate::ClientError;

/// A lock to take or give back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockSpec {
    pub resource: Vec<u8>,
    pub kind: Kind,
    /// This client's name for the owner (a process, an open file).
    pub owner: u32,
    pub mode: Mode,
    /// Inclusive; `Range::WHOLE` for flock and whole-resource DLM locks.
    pub range: Range,
}

impl LockSpec {
    pub(crate) fn target(&self) -> Target {
        Target {
            resource: self.resource.clone(),
            kind: self.kind,
            owner: self.owner,
            start: self.range.start(),
            end: self.range.end(),
        }
    }

    pub(crate) fn core_kind(&self) -> LockKind {
        core_kind(self.kind)
    }

    /// The owner's id in the local table (kinds apart, as at the server).
    pub(crate) fn local_owner(&self) -> u64 {
        local_owner(self.kind, self.owner)
    }

    pub(crate) fn local(&self) -> bool {
        self.kind != Kind::Dlm
    }

    /// Refuses what the server would: a name over the engine's limit
    /// (said here, not as a frame over the protocol's limit).
    pub(crate) fn check(&self) -> Result<(), ClientError> {
        check_name(&self.resource)
    }

    /// This lock as a request to the local table.
    pub(crate) fn local_request(&self, wait: bool) -> LockRequest<'_> {
        LockRequest {
            resource: &self.resource,
            owner: self.local_owner(),
            kind: self.core_kind(),
            mode: self.mode,
            range: self.range,
            wait,
        }
    }
}

/// A local owner id: a POSIX owner and an OFD owner with the same number
/// are different owners (session 0: the table is the client's own).
pub(crate) fn local_owner(kind: Kind, number: u32) -> u64 {
    owner::id(kind, 0, number)
}

pub(crate) fn core_kind(k: Kind) -> LockKind {
    k.into()
}

pub(crate) fn check_name(resource: &[u8]) -> Result<(), ClientError> {
    if resource.len() > interlock_core::MAX_NAME_LEN {
        return Err(ClientError::Invalid(format!(
            "the name is {} bytes; the limit is {}",
            resource.len(),
            interlock_core::MAX_NAME_LEN
        )));
    }
    Ok(())
}
