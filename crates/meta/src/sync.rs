//! The read-write lock behind the intention and name locks: from `loom`
//! when model checking (`RUSTFLAGS="--cfg loom"`, see `locks`), from
//! parking_lot otherwise.

#[cfg(not(loom))]
pub(crate) use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(loom)]
pub(crate) use model::*;

#[cfg(loom)]
mod model {
    pub(crate) use loom::sync::{RwLockReadGuard, RwLockWriteGuard};

    /// loom's lock with parking_lot's API (no poisoning).
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> RwLock<T> {
            RwLock(loom::sync::RwLock::new(value))
        }

        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().expect("not poisoned")
        }

        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().expect("not poisoned")
        }
    }

    impl<T: Default> Default for RwLock<T> {
        fn default() -> Self {
            RwLock::new(T::default())
        }
    }
}
