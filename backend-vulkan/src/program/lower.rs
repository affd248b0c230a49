//! Lowering: the commands of each group, every op but matmul and attention (their own modules),
//! and the fused groups of `fuse`.

use tandem_backend_api::{BackendError, DType, Op, ValueId, WeightRef};
use tandem_gpu_kit::launch::{div_up, spread};
use tandem_gpu_kit::params::norm_format;

use super::block_attention::BlockAttention;
use super::cmd::{Access, Cmd, Push};
use super::fuse::Group;
use super::{format_name, Ctx, WG};
use crate::VulkanBackend;

impl VulkanBackend {
    /// The commands of one group.
    pub(super) fn lower(&self, ctx: &Ctx, group: &Group) -> Result<Vec<Cmd>, BackendError> {
        match *group {
            Group::Single(i) => self.lower_node(ctx, i),
            Group::NormAdd { norm, add, next } => self.lower_norm_add(ctx, norm, add, next),
            Group::NormRope { norm, rope, store } => self.lower_norm_rope(ctx, norm, rope, store),
            // Its rules ask for neither (`fuse::plan`).
            Group::MatMulGeGlu { .. } | Group::NormRopePair { .. } => Err(BackendError::internal(format!(
                "no kernel for the fused group {group:?}"
            ))),
        }
    }

    /// `embed_<fmt>` of `table` into `out`; where `ranged`, only the rows whose token is in
    /// `first ..< first + table rows`, from table row `token - first`.
    fn embed_cmd(
        &self,
        ctx: &Ctx,
        table: &WeightRef,
        scale: f32,
        out: ValueId,
        ranged: bool,
        first: u32,
    ) -> Result<Cmd, BackendError> {
        let t = self.buffers.get(table.buffer)?;
        let (n, cols) = (table.desc.shape[0] as u32, table.desc.shape[1]);
        let dt = table.desc.dtype;
        let row_bytes = dt.row_bytes(cols).unwrap_or(0) as u32;
        let units = if dt.is_quantized() { cols / 32 } else { cols };
        Ok(Cmd::Dispatch {
            kernel: format!("embed_{}", format_name(dt)),
            spec: [u32::from(ranged), 0],
            push: Push::default()
                .u64(t.mem.address)
                .u64(ctx.addr(out)?)
                .u64(ctx.tokens())
                .u32(cols as u32)
                .u32(row_bytes)
                .f32(scale)
                .u32(first)
                .u32(first + n)
                .0,
            groups: [div_up(units, WG as usize), ctx.graph.rows as u32, 1],
            access: Access::new([], [ctx.span(out)?]),
        })
    }

    fn lower_node(&self, ctx: &Ctx, i: usize) -> Result<Vec<Cmd>, BackendError> {
        let node = &ctx.graph.nodes[i];
        let out = || {
            node.outputs
                .first()
                .copied()
                .ok_or_else(|| BackendError::internal("node without output"))
        };
        let cmd = match &node.op {
            Op::Input { .. } => return Ok(vec![]),
            Op::MatMul { x, weight, splits } => {
                return self.lower_matmul(ctx, *x, weight, splits, &node.outputs)
            }
            Op::Attention { .. } => return self.lower_attention(ctx, i),
            Op::LayerNorm { x, weight, bias, eps } => {
                let (w, b) = (self.buffers.get(weight.buffer)?, self.buffers.get(bias.buffer)?);
                Cmd::Dispatch {
                    kernel: "layer_norm".into(),
                    spec: [0, 0],
                    push: Push::default()
                        .u64(ctx.addr(*x)?)
                        .u64(w.mem.address)
                        .u64(b.mem.address)
                        .u64(ctx.addr(out()?)?)
                        .u32(ctx.cols(*x) as u32)
                        .f32(*eps)
                        .u32(norm_format(weight.desc.dtype))
                        .u32(norm_format(bias.desc.dtype))
                        .0,
                    groups: [1, ctx.rows(*x) as u32, 1],
                    access: Access::new([ctx.span(*x)?], [ctx.span(out()?)?]),
                }
            }
            Op::Bias { x, .. } | Op::Gelu { x } => {
                let n = ctx.rows(*x) * ctx.cols(*x);
                // Four elements an invocation where the sizes and addresses allow vec4s.
                let vec = n.is_multiple_of(4)
                    && ctx.cols(*x).is_multiple_of(4)
                    && [ctx.addr(*x)?, ctx.addr(out()?)?]
                        .iter()
                        .all(|a| a.is_multiple_of(16));
                let per = if vec { 4 } else { 1 };
                let [gx, gy] = spread(div_up(n, WG as usize * per));
                let (b, op, fmt) = match &node.op {
                    Op::Bias { bias, .. } => (
                        self.buffers.get(bias.buffer)?.mem.address,
                        0,
                        norm_format(bias.desc.dtype),
                    ),
                    _ => (0, 1, 0),
                };
                Cmd::Dispatch {
                    kernel: "bias_gelu".into(),
                    spec: [u32::from(vec), 0],
                    push: Push::default()
                        .u64(ctx.addr(*x)?)
                        .u64(b)
                        .u64(ctx.addr(out()?)?)
                        .u32(n as u32)
                        .u32(ctx.cols(*x) as u32)
                        .u32(op)
                        .u32(fmt)
                        .0,
                    groups: [gx, gy, 1],
                    access: Access::new([ctx.span(*x)?], [ctx.span(out()?)?]),
                }
            }
            Op::BlockAttention {
                q,
                k,
                v,
                heads,
                head_dim,
                scale,
                block,
            } => {
                let a = BlockAttention {
                    q: *q,
                    k: *k,
                    v: *v,
                    heads: *heads,
                    head_dim: *head_dim,
                    scale: *scale,
                    block: *block,
                };
                return super::block_attention::lower(ctx, self.gpu.coopmat, &a, out()?);
            }
            Op::TopK { x, k } => return super::top_k::lower(ctx, *x, *k, out()?),
            Op::Embed { table, scale, extra } => {
                let vocab = table.desc.shape[0] as u32;
                // With images' rows past the vocabulary, the table's rows and the extra rows
                // take a dispatch each (the `RANGED` variant, which writes only the rows whose
                // token falls in its range); the extra table is read where it is, so the host
                // may rewrite it between steps.
                let mut cmds = vec![self.embed_cmd(ctx, table, *scale, out()?, extra.is_some(), 0)?];
                if let Some(e) = extra {
                    cmds.push(self.embed_cmd(ctx, e, 1.0, out()?, true, vocab)?);
                }
                return Ok(cmds);
            }
            Op::RmsNorm {
                x,
                weight,
                eps,
                weight_offset,
            } => {
                let w = self.buffers.get(weight.buffer)?;
                let cols = ctx.cols(*x);
                let group = weight.desc.numel();
                Cmd::Dispatch {
                    kernel: "rms_norm".into(),
                    spec: [0, 0],
                    push: Push::default()
                        .u64(ctx.addr(*x)?)
                        .u64(w.mem.address)
                        .u64(ctx.addr(out()?)?)
                        .u32(cols as u32)
                        .u32(group as u32)
                        .f32(*eps)
                        .f32(*weight_offset)
                        .u32(norm_format(weight.desc.dtype))
                        .0,
                    groups: [(cols / group) as u32, ctx.rows(*x) as u32, 1],
                    access: Access::new([ctx.span(*x)?], [ctx.span(out()?)?]),
                }
            }
            Op::Rope {
                x, head_dim, factor, ..
            } => {
                let cols = ctx.cols(*x);
                Cmd::Dispatch {
                    kernel: "rope".into(),
                    spec: [0, 0],
                    push: Push::default()
                        .u64(ctx.addr(*x)?)
                        .u64(ctx.addr(out()?)?)
                        .u64(ctx.positions())
                        .u64(ctx.rope_table(i)?)
                        .u32(cols as u32)
                        .u32(*head_dim as u32)
                        .f32(*factor)
                        .0,
                    groups: [div_up(cols / 2, WG as usize), ctx.rows(*x) as u32, 1],
                    access: Access::new([ctx.span(*x)?], [ctx.span(out()?)?]),
                }
            }
            Op::GeGlu { gate: a, up: b } | Op::Add { a, b } => {
                let n = ctx.rows(*a) * ctx.cols(*a);
                let op = u32::from(matches!(node.op, Op::GeGlu { .. }));
                let [gx, gy] = spread(div_up(n, 4 * WG as usize));
                Cmd::Dispatch {
                    kernel: "eltwise".into(),
                    spec: [0, 0],
                    push: Push::default()
                        .u64(ctx.addr(*a)?)
                        .u64(ctx.addr(*b)?)
                        .u64(ctx.addr(out()?)?)
                        .u32(n as u32)
                        .u32(op)
                        .f32(0.0)
                        .0,
                    groups: [gx, gy, 1],
                    access: Access::new([ctx.span(*a)?, ctx.span(*b)?], [ctx.span(out()?)?]),
                }
            }
            Op::Softcap { x, cap } => {
                let n = ctx.rows(*x) * ctx.cols(*x);
                let a = ctx.addr(*x)?;
                let [gx, gy] = spread(div_up(n, 4 * WG as usize));
                Cmd::Dispatch {
                    kernel: "eltwise".into(),
                    spec: [0, 0],
                    push: Push::default()
                        .u64(a)
                        .u64(a)
                        .u64(ctx.addr(out()?)?)
                        .u32(n as u32)
                        .u32(2)
                        .f32(*cap)
                        .0,
                    groups: [gx, gy, 1],
                    access: Access::new([ctx.span(*x)?], [ctx.span(out()?)?]),
                }
            }
            Op::SelectRows { x } => {
                let cols = ctx.cols(*x);
                Cmd::Dispatch {
                    kernel: "select_rows".into(),
                    spec: [0, 0],
                    push: Push::default()
                        .u64(ctx.addr(*x)?)
                        .u64(ctx.addr(out()?)?)
                        .u64(ctx.select())
                        .u32(cols as u32)
                        .0,
                    groups: [div_up(cols, WG as usize), ctx.graph.selected_rows as u32, 1],
                    access: Access::new([ctx.span(*x)?], [ctx.span(out()?)?]),
                }
            }
            Op::Output { x, buffer } => {
                let size = (ctx.rows(*x) * ctx.cols(*x) * 4) as u64;
                if size == 0 {
                    return Ok(vec![]);
                }
                let (src, src_offset, _) = ctx.loc(*x)?;
                let dst = &self.buffers.get(*buffer)?.mem;
                Cmd::Copy {
                    src,
                    src_offset,
                    dst: dst.buffer,
                    size,
                    access: Access::new([ctx.span(*x)?], [(dst.address, dst.address + size)]),
                }
            }
        };
        Ok(vec![cmd])
    }

    /// The pieces of an RmsNorm node.
    fn norm_parts<'a>(
        ctx: &'a Ctx,
        i: usize,
    ) -> Result<(ValueId, &'a WeightRef, f32, f32, ValueId), BackendError> {
        let node = &ctx.graph.nodes[i];
        match (&node.op, node.outputs.first()) {
            (
                Op::RmsNorm {
                    x,
                    weight,
                    eps,
                    weight_offset,
                },
                Some(y),
            ) => Ok((*x, weight, *eps, *weight_offset, *y)),
            _ => Err(BackendError::internal(format!("node {i} is not an rms_norm"))),
        }
    }

    /// `norm_add`: y1 = norm(a); s = h + y1; and with `next`, y2 = norm(s). One workgroup per row.
    fn lower_norm_add(
        &self,
        ctx: &Ctx,
        norm: usize,
        add: usize,
        next: Option<usize>,
    ) -> Result<Vec<Cmd>, BackendError> {
        let (a, w1, eps1, off1, y1) = Self::norm_parts(ctx, norm)?;
        let add_node = &ctx.graph.nodes[add];
        let (Op::Add { a: l, b: r }, Some(s)) = (&add_node.op, add_node.outputs.first().copied()) else {
            return Err(BackendError::internal(format!("node {add} is not an add")));
        };
        let h = if *l == y1 { *r } else { *l };
        let w1b = self.buffers.get(w1.buffer)?.mem.address;
        let mut reads = vec![ctx.span(a)?, ctx.span(h)?];
        let mut writes = vec![ctx.span(y1)?, ctx.span(s)?];
        let (w2b, eps2, off2, fmt2, y2) = match next {
            Some(k) => {
                let (_, w2, eps2, off2, y2) = Self::norm_parts(ctx, k)?;
                writes.push(ctx.span(y2)?);
                (
                    self.buffers.get(w2.buffer)?.mem.address,
                    eps2,
                    off2,
                    norm_format(w2.desc.dtype),
                    ctx.addr(y2)?,
                )
            }
            None => (0, 0.0, 0.0, 0, 0),
        };
        reads.dedup();
        let cols = ctx.cols(a);
        Ok(vec![Cmd::Dispatch {
            kernel: "norm_add".into(),
            spec: [0, 0],
            push: Push::default()
                .u64(ctx.addr(a)?)
                .u64(w1b)
                .u64(ctx.addr(h)?)
                .u64(ctx.addr(s)?)
                .u64(ctx.addr(y1)?)
                .u64(w2b)
                .u64(y2)
                .u32(cols as u32)
                .f32(eps1)
                .f32(off1)
                .u32(norm_format(w1.desc.dtype))
                .f32(eps2)
                .f32(off2)
                .u32(fmt2)
                .u32(u32::from(next.is_some()))
                .0,
            groups: [ctx.rows(a) as u32, 1, 1],
            access: Access::new(reads, writes),
        }])
    }

    /// `norm_rope`: y = norm(x) per head, then rope(y); with `store`, the roped K and the
    /// attention's V rows go into its cache. One workgroup per (head, row).
    fn lower_norm_rope(
        &self,
        ctx: &Ctx,
        norm: usize,
        rope: usize,
        store: Option<usize>,
    ) -> Result<Vec<Cmd>, BackendError> {
        let (x, w, eps, off, y) = Self::norm_parts(ctx, norm)?;
        let rope_node = &ctx.graph.nodes[rope];
        let (Op::Rope { head_dim, factor, .. }, Some(dst)) =
            (&rope_node.op, rope_node.outputs.first().copied())
        else {
            return Err(BackendError::internal(format!("node {rope} is not a rope")));
        };
        let cols = ctx.cols(x);
        let mut reads = vec![ctx.span(x)?];
        let mut writes = vec![ctx.span(y)?, ctx.span(dst)?];
        let (mut kc, mut vc, mut v_addr, mut capacity, mut flags) = (0, 0, 0, 0u32, 0u32);
        if let Some(a) = store {
            let Op::Attention { v, cache, .. } = &ctx.graph.nodes[a].op else {
                return Err(BackendError::internal(format!("node {a} is not an attention")));
            };
            let kb = &self.buffers.get(cache.k)?.mem;
            let vb = &self.buffers.get(cache.v)?.mem;
            kc = kb.address;
            vc = vb.address;
            v_addr = ctx.addr(*v)?;
            capacity = cache.capacity as u32;
            flags = 1 | if cache.dtype == DType::F16 { 2 } else { 0 };
            reads.push(ctx.span(*v)?);
            writes.push((kc, kc + kb.size));
            writes.push((vc, vc + vb.size));
        }
        Ok(vec![Cmd::Dispatch {
            kernel: "norm_rope".into(),
            spec: [0, 0],
            push: Push::default()
                .u64(ctx.addr(x)?)
                .u64(self.buffers.get(w.buffer)?.mem.address)
                .u64(ctx.addr(y)?)
                .u64(ctx.addr(dst)?)
                .u64(ctx.positions())
                .u64(ctx.rope_table(rope)?)
                .u64(kc)
                .u64(vc)
                .u64(v_addr)
                .u64(ctx.slots())
                .u32(cols as u32)
                .u32(*head_dim as u32)
                .f32(eps)
                .f32(off)
                .u32(norm_format(w.desc.dtype))
                .f32(*factor)
                .u32(capacity)
                .u32(flags)
                .0,
            groups: [(cols / head_dim) as u32, ctx.rows(x) as u32, 1],
            access: Access::new(reads, writes),
        }])
    }
}
