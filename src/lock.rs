//! Locking that goes on after a panic on another thread.

use std::sync::{Mutex, MutexGuard};

/// `m`'s guard, poisoned or not. Every mutex of the crate guards a cache, a
/// pool, a set of checked objects or a readback's state and book, each
/// changed in single statements, so a panic elsewhere while one was held
/// cannot leave it half-written; going on with it is right, where
/// `unwrap()` would turn one thread's panic into every later call's.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
