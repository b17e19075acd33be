//! Stored bodies kept in sealed in-memory files, which a plain socket is handed with
//! `sendfile(2)`: the kernel gives the file's pages to the socket instead of copying the
//! bytes from user memory once per hit. nginx serves its proxy_cache hits the same way from
//! its cache files: on this project's machine its 100 KiB hits ran at 0.65 × the rate with
//! `sendfile off`.
//!
//! A file is an anonymous memfd, written once and then sealed against any write, shrink or
//! growth, so the bytes a hit sends can never change under it. Each file holds a descriptor,
//! so their number is bounded ([`MAX_SEALED_FILES`], part of the host's reserved
//! descriptors); beyond the bound, or when the kernel refuses a memfd, a body stays in
//! ordinary memory and is served from there.

use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
use tracing::debug;

/// Bodies from this size up are kept in sealed files (while [`MAX_SEALED_FILES`] allows).
/// Below it, one copy costs about what the second system call of a head-then-file send
/// does: a bound chosen, not measured.
pub const SEALED_FROM: u64 = 32 * 1024;

/// Sealed files open at once, at most: each holds a descriptor. The host keeps this many
/// out of its session budget (`wharf_host`'s reserved descriptors).
pub const MAX_SEALED_FILES: usize = 128;

/// The bound the cache's bodies are held to.
static BUDGET: FileBudget = FileBudget::new(MAX_SEALED_FILES);

/// A body's bytes in a sealed in-memory file.
#[derive(Debug)]
pub struct SealedFile {
    file: File,
    len: u64,
    /// Counted in its budget until dropped.
    _slot: Slot,
}

impl SealedFile {
    /// A sealed file holding `chunks` (`len` bytes in all); `None` when the bound of open
    /// files is reached or the kernel refused (the body then stays in memory).
    pub fn create(chunks: &[Bytes], len: u64) -> Option<Self> {
        Self::create_within(&BUDGET, chunks, len)
    }

    /// [`SealedFile::create`] within `budget`.
    fn create_within(budget: &'static FileBudget, chunks: &[Bytes], len: u64) -> Option<Self> {
        let slot = budget.take()?;
        match write_sealed(chunks) {
            Ok(file) => Some(Self {
                file,
                len,
                _slot: slot,
            }),
            Err(error) => {
                debug!(error = %error, "no sealed file for a cached body; keeping it in memory");
                None
            }
        }
    }

    /// The body's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file's bytes, read into memory (for a writer that needs them as bytes: the
    /// shared tier).
    pub fn read_all(&self) -> io::Result<Bytes> {
        use std::os::unix::fs::FileExt;
        let len = usize::try_from(self.len).map_err(|_| io::ErrorKind::OutOfMemory)?;
        let mut bytes = vec![0u8; len];
        self.file.read_exact_at(&mut bytes, 0)?;
        Ok(Bytes::from(bytes))
    }
}

impl AsRef<File> for SealedFile {
    fn as_ref(&self) -> &File {
        &self.file
    }
}

/// A memfd holding `chunks`, sealed.
fn write_sealed(chunks: &[Bytes]) -> io::Result<File> {
    let fd = memfd_create(
        "wharf-cache-body",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut file = File::from(fd);
    for chunk in chunks {
        file.write_all(chunk)?;
    }
    fcntl_add_seals(
        &file,
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?;
    Ok(file)
}

/// A bound on sealed files open at once.
#[derive(Debug)]
struct FileBudget {
    open: AtomicUsize,
    max: usize,
}

impl FileBudget {
    const fn new(max: usize) -> Self {
        Self {
            open: AtomicUsize::new(0),
            max,
        }
    }

    /// One place, if the bound allows.
    fn take(&'static self) -> Option<Slot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |open| {
                (open < self.max).then_some(open + 1)
            })
            .ok()
            .map(|_| Slot(self))
    }
}

/// One place in a [`FileBudget`], held while its file is open.
#[derive(Debug)]
struct Slot(&'static FileBudget);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_sealed_file_holds_the_chunks_and_refuses_writes() {
        let chunks = [Bytes::from_static(b"hello, "), Bytes::from_static(b"world")];
        let sealed = SealedFile::create(&chunks, 12).expect("a memfd on Linux");
        assert_eq!(sealed.read_all().unwrap(), "hello, world");
        assert_eq!(sealed.len(), 12);
        // Sealed: neither written nor grown through any handle.
        let file = sealed.as_ref();
        assert!(file.write_at(b"H", 0).is_err());
        assert!(file.set_len(1).is_err());
        assert!(file.set_len(100).is_err());
        assert_eq!(sealed.read_all().unwrap(), "hello, world");
    }

    #[test]
    fn open_files_are_bounded_and_given_back() {
        // A budget of its own: the cache's is shared with the other tests of this binary.
        static SMALL: FileBudget = FileBudget::new(3);
        let create = || SealedFile::create_within(&SMALL, &[Bytes::from_static(b"x")], 1);
        let mut held = Vec::new();
        while let Some(sealed) = create() {
            held.push(sealed);
            assert!(held.len() <= 3);
        }
        assert_eq!(held.len(), 3);
        assert!(create().is_none());
        held.pop();
        assert!(create().is_some());
    }
}
