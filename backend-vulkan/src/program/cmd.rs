//! The commands a program records: dispatches and copies, each with the device-address ranges it
//! reads and writes, from which `record` places barriers only where one command's memory overlaps
//! an earlier one's since the last barrier.

use ash::vk;

/// Push constants in the kernels' scalar layout.
#[derive(Default)]
pub struct Push(pub Vec<u8>);

impl Push {
    pub fn u64(mut self, v: u64) -> Self {
        while !self.0.len().is_multiple_of(8) {
            self.0.push(0);
        }
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn f32(mut self, v: f32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// A range of device addresses, `start..end`.
pub type Span = (u64, u64);

/// What a command reads and writes (weights and step arguments, which no program writes, are
/// left out).
#[derive(Default, Clone)]
pub struct Access {
    pub reads: Vec<Span>,
    pub writes: Vec<Span>,
}

impl Access {
    pub fn new(reads: impl IntoIterator<Item = Span>, writes: impl IntoIterator<Item = Span>) -> Access {
        Access {
            reads: reads.into_iter().collect(),
            writes: writes.into_iter().collect(),
        }
    }
}

/// One command.
pub enum Cmd {
    Dispatch {
        kernel: String,
        /// Specialisation constants 0 and 1.
        spec: [u32; 2],
        push: Vec<u8>,
        groups: [u32; 3],
        access: Access,
    },
    Copy {
        src: vk::Buffer,
        src_offset: u64,
        dst: vk::Buffer,
        size: u64,
        access: Access,
    },
}

impl Cmd {
    pub fn access(&self) -> &Access {
        match self {
            Cmd::Dispatch { access, .. } | Cmd::Copy { access, .. } => access,
        }
    }
}

fn overlaps(a: Span, b: Span) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// The accesses since the last barrier.
#[derive(Default)]
pub struct Hazards {
    reads: Vec<Span>,
    writes: Vec<Span>,
}

impl Hazards {
    /// Whether `a` must wait for what came since the last barrier: it reads what was written, or
    /// writes what was read or written.
    pub fn conflicts(&self, a: &Access) -> bool {
        a.reads
            .iter()
            .any(|r| self.writes.iter().any(|w| overlaps(*r, *w)))
            || a.writes
                .iter()
                .any(|w| self.writes.iter().chain(&self.reads).any(|x| overlaps(*w, *x)))
    }

    /// Notes `a` as running since the last barrier.
    pub fn add(&mut self, a: &Access) {
        self.reads.extend_from_slice(&a.reads);
        self.writes.extend_from_slice(&a.writes);
    }

    /// A barrier was recorded.
    pub fn clear(&mut self) {
        self.reads.clear();
        self.writes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn barriers_go_only_where_memory_overlaps() {
        let mut h = Hazards::default();
        let first = Access::new([(0, 100)], [(100, 200)]);
        assert!(!h.conflicts(&first));
        h.add(&first);
        // Reads what the first wrote.
        assert!(h.conflicts(&Access::new([(150, 160)], [])));
        // Writes what the first read.
        assert!(h.conflicts(&Access::new([], [(99, 101)])));
        // Writes what the first wrote.
        assert!(h.conflicts(&Access::new([], [(199, 300)])));
        // Reads what the first read, writes elsewhere: runs alongside.
        assert!(!h.conflicts(&Access::new([(0, 100)], [(200, 300)])));
        h.clear();
        assert!(!h.conflicts(&Access::new([(150, 160)], [(0, 100)])));
    }
}
