//! The program table every backend keeps (which records the buffers each program names, so
//! that `free` refuses a buffer still in use), and ticket counting.

use std::collections::HashMap;

use crate::backend::{ProgramId, Ticket};
use crate::error::BackendError;
use crate::graph::StepArgs;
use crate::kit::step::StepShape;
use crate::tensor::BufferId;

/// The error for a program id this backend did not issue (or already released):
/// `unknown program 3`.
pub fn unknown_program(id: ProgramId) -> BackendError {
    BackendError::invalid(format!("unknown program {}", id.0))
}

/// One compiled program as the table keeps it: the backend's own part, the buffers it names
/// and the shape its step arguments must have.
#[derive(Debug)]
pub struct Compiled<P> {
    id: ProgramId,
    /// The backend's own part (pipelines, command buffers, value storage).
    pub program: P,
    buffers: Vec<BufferId>,
    step: StepShape,
}

impl<P> Compiled<P> {
    /// The program's id.
    pub fn id(&self) -> ProgramId {
        self.id
    }

    /// Every buffer the program reads or writes, sorted.
    pub fn buffers(&self) -> &[BufferId] {
        &self.buffers
    }

    /// The shape its step arguments must have.
    pub fn step(&self) -> &StepShape {
        &self.step
    }
}

/// A backend's compiled programs by id: `P` is whatever the backend keeps per program. Ids are
/// issued from 1 upwards and never reused.
#[derive(Debug)]
pub struct Programs<P> {
    entries: HashMap<u64, Compiled<P>>,
    next: u64,
}

impl<P> Default for Programs<P> {
    fn default() -> Self {
        Programs {
            entries: HashMap::new(),
            next: 1,
        }
    }
}

impl<P> Programs<P> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a compiled program naming `buffers` (from [`crate::kit::buffers::check_buffers`]
    /// or [`crate::kit::buffers::named_buffers`]) whose steps have the shape `step`, and
    /// returns its new id.
    pub fn insert(&mut self, program: P, mut buffers: Vec<BufferId>, step: StepShape) -> ProgramId {
        buffers.sort();
        buffers.dedup();
        let id = ProgramId(self.next);
        self.next += 1;
        self.entries.insert(
            id.0,
            Compiled {
                id,
                program,
                buffers,
                step,
            },
        );
        id
    }

    /// The program behind `id`, or `unknown program N`.
    pub fn get(&self, id: ProgramId) -> Result<&Compiled<P>, BackendError> {
        self.entries.get(&id.0).ok_or_else(|| unknown_program(id))
    }

    /// The program behind `id`, mutably, or `unknown program N`.
    pub fn get_mut(&mut self, id: ProgramId) -> Result<&mut Compiled<P>, BackendError> {
        self.entries.get_mut(&id.0).ok_or_else(|| unknown_program(id))
    }

    /// The program behind `id` once `args` have been checked against its step shape (see
    /// [`StepShape::check`]): what `execute` starts with.
    pub fn for_step(&mut self, id: ProgramId, args: &StepArgs<'_>) -> Result<&mut Compiled<P>, BackendError> {
        let c = self.get_mut(id)?;
        c.step.check(args)?;
        Ok(c)
    }

    /// Takes the program behind `id` out of the table, for a backend whose execution needs the
    /// program and the rest of the backend mutably at once; [`Programs::put_back`] returns it.
    /// While it is out, its buffers count as unused.
    pub fn take(&mut self, id: ProgramId) -> Result<Compiled<P>, BackendError> {
        self.entries.remove(&id.0).ok_or_else(|| unknown_program(id))
    }

    /// Returns a program [`Programs::take`] took out, under its id.
    pub fn put_back(&mut self, compiled: Compiled<P>) {
        self.entries.insert(compiled.id.0, compiled);
    }

    /// Removes the program behind `id` and returns the backend's part, to destroy; its buffers
    /// can be freed afterwards.
    pub fn release(&mut self, id: ProgramId) -> Result<P, BackendError> {
        self.take(id).map(|c| c.program)
    }

    /// A program that names `buffer`, if any.
    pub fn user_of(&self, buffer: BufferId) -> Option<ProgramId> {
        self.entries
            .values()
            .find(|c| c.buffers.binary_search(&buffer).is_ok())
            .map(|c| c.id)
    }

    /// Fails when a program names `buffer`: `buffer 7 is used by program 3: release it first`.
    /// `free` calls this before it releases anything.
    pub fn check_unused(&self, buffer: BufferId) -> Result<(), BackendError> {
        match self.user_of(buffer) {
            Some(p) => Err(BackendError::invalid(format!(
                "buffer {} is used by program {}: release it first",
                buffer.0, p.0
            ))),
            None => Ok(()),
        }
    }

    /// Every program, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Compiled<P>> {
        self.entries.values()
    }

    /// Every program, mutably, in no particular order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Compiled<P>> {
        self.entries.values_mut()
    }

    /// Removes every program (a backend being dropped) and returns the backends' parts.
    pub fn drain(&mut self) -> impl Iterator<Item = P> + '_ {
        self.entries.drain().map(|(_, c)| c.program)
    }

    /// How many programs there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The error unless `ticket` is one of the first `issued` tickets (numbered from 1):
/// `unknown ticket 9`. For backends whose queue numbers its submissions itself (a Vulkan
/// timeline); others count with [`Tickets`].
pub fn check_ticket(ticket: Ticket, issued: u64) -> Result<(), BackendError> {
    if ticket.0 == 0 || ticket.0 > issued {
        return Err(BackendError::invalid(format!("unknown ticket {}", ticket.0)));
    }
    Ok(())
}

/// Tickets issued by `execute`, numbered from 1.
#[derive(Debug, Clone, Default)]
pub struct Tickets {
    issued: u64,
}

impl Tickets {
    /// None issued yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next ticket.
    pub fn issue(&mut self) -> Ticket {
        self.issued += 1;
        Ticket(self.issued)
    }

    /// How many have been issued (the number of the last one).
    pub fn issued(&self) -> u64 {
        self.issued
    }

    /// Fails unless `ticket` was issued here (see [`check_ticket`]).
    pub fn check(&self, ticket: Ticket) -> Result<(), BackendError> {
        check_ticket(ticket, self.issued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GraphBuilder;

    fn shape() -> StepShape {
        StepShape::of(&GraphBuilder::new("g", 1, 0).finish())
    }

    #[test]
    fn programs_are_found_until_released() {
        let mut p: Programs<&str> = Programs::new();
        let a = p.insert("a", vec![BufferId(2), BufferId(5)], shape());
        let b = p.insert("b", vec![BufferId(5)], shape());
        assert_ne!(a, b);
        assert_eq!(p.get(a).unwrap().program, "a");
        assert_eq!(p.get(b).unwrap().buffers(), &[BufferId(5)]);
        assert!(p.check_unused(BufferId(2)).is_err());
        assert!(p.check_unused(BufferId(3)).is_ok());
        assert_eq!(p.release(a).unwrap(), "a");
        assert!(p.check_unused(BufferId(2)).is_ok());
        let err = p.check_unused(BufferId(5)).unwrap_err().to_string();
        assert!(err.contains(&format!("used by program {}", b.0)), "{err}");
        let err = p.release(a).unwrap_err().to_string();
        assert_eq!(err, format!("invalid argument: unknown program {}", a.0));
        assert!(p.get(a).is_err() && p.get_mut(a).is_err());
        let c = p.take(b).unwrap();
        assert!(p.is_empty());
        p.put_back(c);
        assert_eq!(p.len(), 1);
        assert_eq!(p.get(b).unwrap().id(), b);
        assert_eq!(p.drain().collect::<Vec<_>>(), vec!["b"]);
    }

    #[test]
    fn execute_checks_the_step_before_handing_out_the_program() {
        let mut p: Programs<u32> = Programs::new();
        let id = p.insert(7, vec![], shape());
        let ok = StepArgs {
            tokens: &[0],
            positions: &[0],
            slots: &[0],
            select: &[],
        };
        assert_eq!(p.for_step(id, &ok).unwrap().program, 7);
        let bad = StepArgs { positions: &[], ..ok };
        let err = p.for_step(id, &bad).unwrap_err().to_string();
        assert!(err.contains("step positions: 0 given"), "{err}");
        assert!(p.for_step(ProgramId(99), &ok).is_err());
    }

    #[test]
    fn tickets_are_known_once_issued() {
        let mut t = Tickets::new();
        assert!(t.check(Ticket(1)).is_err());
        assert_eq!(t.issue(), Ticket(1));
        assert_eq!(t.issue(), Ticket(2));
        assert!(t.check(Ticket(2)).is_ok());
        assert_eq!(t.issued(), 2);
        for bad in [0, 3] {
            let err = t.check(Ticket(bad)).unwrap_err().to_string();
            assert_eq!(err, format!("invalid argument: unknown ticket {bad}"));
        }
    }
}
