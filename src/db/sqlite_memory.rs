//! SQLite's own count of the heap it holds (page caches, schemas, prepared statements),
//! for the whole process. It lives outside Rust's allocator, so without it a rise of
//! the daemon's RSS on SQLite cannot be told apart from a leak of ours.
#![expect(
    unsafe_code,
    reason = "sqlite3_memory_used is a C function; it reads a counter and takes nothing"
)]

/// Bytes SQLite has allocated and not freed, all connections together.
pub fn used_bytes() -> i64 {
    // SAFETY: sqlite3_memory_used takes no arguments and only reads SQLite's memory
    // statistics under its own mutex; it is callable from any thread at any time, also
    // before SQLite is initialised (it then returns 0).
    unsafe { libsqlite3_sys::sqlite3_memory_used() }
}
