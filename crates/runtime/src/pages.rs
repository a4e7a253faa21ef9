//! Handing back the resident pages of memory-mapped weights once a session has packed them.
//!
//! A weight read from a memory-mapped model file (ONNX or `.encore`) is copied into the kernel's
//! packed layout when a session is compiled; the file pages it was read from then stay mapped
//! and count in the process's resident set, so every packed weight was resident twice (BERT-base
//! INT8: 85 MB of int8 weights besides their packed copies). Once a weight is packed, its pages
//! are released with `madvise(MADV_DONTNEED)`: for a read-only shared file mapping that only
//! drops the page-table entries, and a later read (a table read in place, another session
//! packing the same model) faults the same file contents back in from the page cache.
//!
//! Which memory is such a mapping is read from `/proc/self/maps` rather than trusted from the
//! caller: a heap buffer (a weight the passes rewrote, a model imported from bytes) must never be
//! advised, since `MADV_DONTNEED` on anonymous memory zeroes it.

/// The read-only shared file mappings of this process when it was read (Linux; elsewhere none,
/// and [`FileMappings::release`] does nothing).
pub(crate) struct FileMappings {
    ranges: Vec<std::ops::Range<usize>>,
}

impl FileMappings {
    /// Reads this process's read-only, shared, file-backed mappings.
    pub fn read() -> FileMappings {
        let text = if cfg!(target_os = "linux") {
            std::fs::read_to_string("/proc/self/maps").unwrap_or_default()
        } else {
            String::new()
        };
        FileMappings {
            ranges: text.lines().filter_map(read_only_shared_file).collect(),
        }
    }

    /// Releases the resident pages that lie wholly inside `data`, when `data` lies inside one
    /// read-only shared file mapping; returns the bytes released (0 otherwise). The contents
    /// seen through `data` do not change.
    pub fn release(&self, data: &[u8]) -> usize {
        let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
        if !self.ranges.iter().any(|r| r.start <= start && end <= r.end) {
            return 0;
        }
        let page = page_size();
        let (first, last) = (start.next_multiple_of(page), end / page * page);
        if last <= first {
            return 0;
        }
        release_range(first, last - first)
    }
}

/// `start..end` of a `/proc/self/maps` line that maps a file read-only and shared
/// (`r--s` / `r-xs`, a non-zero inode).
fn read_only_shared_file(line: &str) -> Option<std::ops::Range<usize>> {
    let mut fields = line.split_whitespace();
    let (range, perms) = (fields.next()?, fields.next()?);
    let inode = fields.nth(2)?;
    let p = perms.as_bytes();
    if p.len() != 4 || p[0] != b'r' || p[1] != b'-' || p[3] != b's' || inode == "0" {
        return None;
    }
    let (a, b) = range.split_once('-')?;
    let (a, b) = (
        usize::from_str_radix(a, 16).ok()?,
        usize::from_str_radix(b, 16).ok()?,
    );
    (a < b).then_some(a..b)
}

#[cfg(target_os = "linux")]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

#[cfg(not(target_os = "linux"))]
fn page_size() -> usize {
    4096
}

#[cfg(target_os = "linux")]
fn release_range(addr: usize, len: usize) -> usize {
    // SAFETY: `addr..addr + len` is page-aligned and inside a mapping that /proc/self/maps
    // lists as read-only, shared and file-backed; for such a mapping MADV_DONTNEED discards only
    // page-table entries (a shared mapping has no private copies to lose, and nothing can be
    // dirty without write permission), and later accesses read the file's unchanged contents.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    if rc == 0 {
        len
    } else {
        0
    }
}

#[cfg(not(target_os = "linux"))]
fn release_range(_addr: usize, _len: usize) -> usize {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_shared_file_mappings_are_listed() {
        let shared = "7f00a0000000-7f00a8000000 r--s 00000000 fd:01 1234  /tmp/m.encore";
        assert_eq!(
            read_only_shared_file(shared),
            Some(0x7f00a0000000..0x7f00a8000000)
        );
        for line in [
            "7f00a0000000-7f00a8000000 r--p 00000000 fd:01 1234  /usr/lib/libc.so.6",
            "7f00a0000000-7f00a8000000 rw-s 00000000 fd:01 1234  /tmp/m.encore",
            "55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0      [heap]",
            "7ffd00000000-7ffd00021000 r--s 00000000 00:00 0",
            "garbage",
        ] {
            assert_eq!(read_only_shared_file(line), None, "{line}");
        }
    }

    /// Heap memory is never advised (it would be zeroed); a mapped file's bytes read the same
    /// after their pages are released.
    #[cfg(target_os = "linux")]
    #[test]
    fn released_pages_read_back_the_same_and_heap_is_left_alone() {
        let heap = vec![7u8; 1 << 20];
        let maps = FileMappings::read();
        assert_eq!(maps.release(&heap), 0);
        assert!(heap.iter().all(|&b| b == 7));

        let path = std::env::temp_dir().join(format!("encore-pages-{}.bin", std::process::id()));
        let want: Vec<u8> = (0..(1usize << 20) + 123).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &want).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a private temporary file nobody else writes while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert_eq!(&map[..], &want[..]);
        let maps = FileMappings::read();
        let released = maps.release(&map[100..]);
        assert!(
            released >= (1 << 20) - 2 * page_size(),
            "released {released}"
        );
        assert_eq!(&map[..], &want[..]);
        drop(map);
        let _ = std::fs::remove_file(&path);
    }
}
