//! The execution-phase rule of thread-block graphs — written once, used by the builder
//! (validation), the block-execution driver (reference evaluator and fingerprints) and,
//! later, the abstract-expression builder, the cost model and code generators.
//!
//! Rule:
//! * inputs are loaded in the loop body (every iteration; `fmap = -1` inputs are loaded
//!   once but still belong to the loop body);
//! * an op whose operands are all loop-body tiles runs every iteration (**loop body**);
//! * a `forloop_accum` takes a loop-body tile, updates every iteration and yields an
//!   **after-loop** tile;
//! * an op whose operands are all after-loop tiles runs once after the loop;
//! * mixing a loop-body tile with an after-loop tile is rejected (MappingError): the
//!   loop-body value is different in each iteration, so the fix is to accumulate it.
//! * outputs must be after-loop tiles.

use crate::error::{mapping_err, Result};

/// When a tile is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Recomputed in every for-loop iteration.
    LoopBody,
    /// Computed once after the for-loop (downstream of an accumulator).
    AfterLoop,
}

/// What kind of op the rule is applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseClass {
    /// A tile loaded from a kernel input.
    Input,
    /// A for-loop accumulator.
    Accumulator,
    /// Any other tile op.
    Compute,
}

/// Phase of an op's result from its class and its operands `(tile id, phase)`;
/// `what` names the op for messages.
pub fn infer_phase(what: &str, class: PhaseClass, operands: &[(usize, Phase)]) -> Result<Phase> {
    match class {
        PhaseClass::Input => Ok(Phase::LoopBody),
        PhaseClass::Accumulator => {
            if let Some((t, _)) = operands.iter().find(|(_, p)| *p == Phase::AfterLoop) {
                return mapping_err(format!(
                    "{what}: tile t{t} is already after the loop (downstream of a forloop_accum); \
                     only loop-body tiles can be accumulated"
                ));
            }
            Ok(Phase::AfterLoop)
        }
        PhaseClass::Compute => {
            let body = operands.iter().find(|(_, p)| *p == Phase::LoopBody);
            let after = operands.iter().find(|(_, p)| *p == Phase::AfterLoop);
            match (body, after) {
                (Some((b, _)), Some((a, _))) => mapping_err(format!(
                    "{what}: mixes loop-body tile t{b} with after-loop tile t{a}; \
                     wrap t{b} in forloop_accum (or compute t{a}'s operands in the loop body)"
                )),
                (None, Some(_)) => Ok(Phase::AfterLoop),
                _ => Ok(Phase::LoopBody),
            }
        }
    }
}

/// Check that a tile can be a block-graph output.
pub fn check_output_phase(tile: usize, phase: Phase) -> Result<()> {
    if phase == Phase::AfterLoop {
        Ok(())
    } else {
        mapping_err(format!(
            "output of tile t{tile} must come after forloop_accum (wrap t{tile} in forloop_accum)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Phase::*;

    #[test]
    fn rule() {
        assert_eq!(infer_phase("x", PhaseClass::Input, &[]).unwrap(), LoopBody);
        assert_eq!(
            infer_phase("x", PhaseClass::Compute, &[(0, LoopBody), (1, LoopBody)]).unwrap(),
            LoopBody
        );
        assert_eq!(
            infer_phase("x", PhaseClass::Accumulator, &[(0, LoopBody)]).unwrap(),
            AfterLoop
        );
        assert_eq!(
            infer_phase("x", PhaseClass::Compute, &[(0, AfterLoop)]).unwrap(),
            AfterLoop
        );
        let e =
            infer_phase("add", PhaseClass::Compute, &[(0, LoopBody), (1, AfterLoop)]).unwrap_err();
        assert!(e.to_string().contains("wrap t0 in forloop_accum"));
        assert!(infer_phase("a", PhaseClass::Accumulator, &[(3, AfterLoop)]).is_err());
        assert!(check_output_phase(2, LoopBody)
            .unwrap_err()
            .to_string()
            .contains("output of tile t2 must come after forloop_accum"));
    }
}
