//! `Op::TopK` on `top_k.comp`, in the passes `kit::top_k` plans (bitonic sorts of 2048 keys in
//! shared memory, merged until one list per row is left). The lists live in the program
//! scratch, in two areas the passes write in turn.

use tandem_backend_api::kit::top_k::passes;
pub(super) use tandem_backend_api::kit::top_k::scratch_bytes;
use tandem_backend_api::{BackendError, ValueId};

use super::cmd::{Access, Cmd, Push};
use super::Ctx;

/// The commands of a top-k node: `x` in, `out` (`[rows, 2k]`) out.
pub(super) fn lower(ctx: &Ctx, x: ValueId, k: usize, out: ValueId) -> Result<Vec<Cmd>, BackendError> {
    let (rows, cols) = (ctx.rows(x), ctx.cols(x));
    let passes = passes(cols, k);
    let area = tandem_backend_api::kit::top_k::area_bytes(rows, cols, k);
    let areas = [
        (ctx.scratch.0, ctx.scratch.0 + area),
        (ctx.scratch.0 + area, ctx.scratch.0 + 2 * area),
    ];
    if passes.len() > 1 && areas[1].1 > ctx.scratch.1 {
        return Err(BackendError::internal(format!(
            "top_k's lists ({rows} rows of {cols}, k {k}) do not fit the program's scratch"
        )));
    }
    let mut cmds = Vec::with_capacity(passes.len());
    for (i, pass) in passes.iter().enumerate() {
        let last = i + 1 == passes.len();
        let src = if pass.from_values {
            ctx.span(x)?
        } else {
            areas[(i + 1) % 2]
        };
        let dst = if last { ctx.span(out)? } else { areas[i % 2] };
        cmds.push(Cmd::Dispatch {
            kernel: "top_k".into(),
            spec: [0, 0],
            push: Push::default()
                .u64(src.0)
                .u64(dst.0)
                .u32(pass.n as u32)
                .u32(k as u32)
                .u32(pass.per as u32)
                .u32(u32::from(pass.from_values))
                .u32(u32::from(last))
                .u32(pass.groups as u32)
                .0,
            groups: [pass.groups as u32, rows as u32, 1],
            access: Access::new([src], [dst]),
        });
    }
    Ok(cmds)
}
