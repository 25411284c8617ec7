//! [`Gate`]: first come, first served on one thread, for work that may yield half-way but must
//! not interleave with the next of its kind (a topic's fan-outs, in offset order).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// A first-come-first-served gate on one thread: work that may yield half-way but must not
/// interleave with the next of its kind (fan-outs of a topic's events, in offset order) passes
/// one at a time, in the order places were taken ([`Gate::join`], synchronous, so a place can
/// be taken where the order is decided and used later in a spawned task). Uncontended,
/// entering costs no wait.
#[derive(Default)]
pub struct Gate {
    inner: RefCell<GateState>,
}

#[derive(Default)]
struct GateState {
    /// The ticket now served: the first slot's.
    serving: u64,
    /// One slot per place taken and not yet done, in ticket order from `serving`: the waker of
    /// one waiting, and whether its holder went away before its turn (skipped when it comes).
    slots: VecDeque<(Option<Waker>, bool)>,
}

/// A place in a [`Gate`]'s line. Once [`Place::enter`] resolves it holds the gate until dropped;
/// dropped before its turn, it gives the place up.
pub struct Place {
    gate: Rc<Gate>,
    ticket: u64,
}

impl Gate {
    /// Takes the next place in line.
    pub fn join(gate: &Rc<Gate>) -> Place {
        let mut g = gate.inner.borrow_mut();
        g.slots.push_back((None, false));
        Place { gate: gate.clone(), ticket: g.serving + g.slots.len() as u64 - 1 }
    }
}

impl GateState {
    fn slot(&mut self, ticket: u64) -> &mut (Option<Waker>, bool) {
        let i = (ticket - self.serving) as usize;
        &mut self.slots[i]
    }
}

impl Place {
    /// Waits until it is this place's turn.
    pub async fn enter(&self) {
        poll_fn(|cx| {
            let mut g = self.gate.inner.borrow_mut();
            if g.serving == self.ticket {
                return Poll::Ready(());
            }
            g.slot(self.ticket).0 = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let next = {
            let mut g = self.gate.inner.borrow_mut();
            if g.serving != self.ticket {
                *g.slot(self.ticket) = (None, true);
                return;
            }
            g.slots.pop_front();
            g.serving += 1;
            while g.slots.front().is_some_and(|s| s.1) {
                g.slots.pop_front();
                g.serving += 1;
            }
            g.slots.front_mut().and_then(|s| s.0.take())
        };
        if let Some(w) = next {
            w.wake();
        }
    }
}
