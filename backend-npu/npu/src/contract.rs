//! tandem's NPU attention kernel ABI, version 1 (`shaders/npu/CONTRACT.md` is the normative
//! text): the arguments of one dispatch, the shapes the kernels take, and the bf16 rounding
//! every part of the NPU path shares. The emulator ([`crate::emu`]), the device executor and
//! the AIE kernel sources all follow this module.

use serde::{Deserialize, Serialize};
use tandem_backend_api::{DType, Op};

/// The kernel ABI this build speaks; artefacts built for another are refused.
pub const ABI_VERSION: u32 = 1;
/// Keys per block of the online softmax, aligned to absolute multiples of it.
pub const KV_BLOCK: usize = 128;
/// f32 accumulator lanes of a dot product (the AIE vector width for bf16 MACs into f32).
pub const LANES: usize = 16;
/// Query rows of one sequence a prefill tile processes against each key block.
pub const PREFILL_Q_BLOCK: usize = 32;
/// The largest head size the kernels take (a Q row, a K and a V block of 128 keys in bf16
/// must fit one compute tile's data memory, in chunks).
pub const MAX_HEAD_DIM: usize = 256;
/// The largest number of query heads sharing one kv head.
pub const MAX_GROUP: usize = 8;
/// `log2(e)` as the kernels hold it: rounded to bf16 (1.4453125).
pub const LOG2E_BF16: f32 = 1.4453125;
/// Words of [`AttnParams`] before the per-row pairs.
pub const PARAMS_HEADER_WORDS: usize = 9;

/// Rounds `x` to bf16, to nearest with ties to even, as the AIE's f32-to-bf16 conversion does.
pub fn bf16_round(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        // A quiet NaN with the sign kept.
        return ((bits >> 16) as u16) | 0x0040;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// The f32 value of a bf16.
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// `x` rounded through bf16 and back.
pub fn through_bf16(x: f32) -> f32 {
    bf16_to_f32(bf16_round(x))
}

/// Which kernel of a shape runs a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// One row per sequence.
    Decode,
    /// Blocks of up to [`PREFILL_Q_BLOCK`] query rows of one sequence.
    Prefill,
}

impl Phase {
    /// The phase of a step: decode when no slot has more than one row.
    pub fn of_step(slots: &[u32]) -> Phase {
        let mut seen = std::collections::HashSet::with_capacity(slots.len());
        if slots.iter().all(|s| seen.insert(*s)) {
            Phase::Decode
        } else {
            Phase::Prefill
        }
    }

    /// `decode` or `prefill`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Decode => "decode",
            Phase::Prefill => "prefill",
        }
    }
}

/// What selects a compiled kernel: its head size and GQA group (query heads per kv head).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelShape {
    /// Size of one head.
    pub head_dim: usize,
    /// Query heads per kv head.
    pub group: usize,
}

impl std::fmt::Display for KernelShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "head_dim {} group {}", self.head_dim, self.group)
    }
}

/// The kernel shape of an attention op, or why the kernels cannot run it. Only what the kernel
/// design itself rules out is refused here; which shapes have built artefacts is the device
/// executor's question.
pub fn kernel_shape(op: &Op) -> Result<KernelShape, String> {
    let Op::Attention {
        heads,
        kv_heads,
        head_dim,
        softcap,
        cache,
        bidirectional_from,
        ..
    } = op
    else {
        return Err("the NPU kernels run attention only".into());
    };
    if bidirectional_from.is_some() {
        return Err("the NPU attention kernel is causal only (no image blocks)".into());
    }
    if softcap.is_some() {
        return Err("the NPU attention kernel has no score soft-capping (Gemma 3 does not use it)".into());
    }
    if *kv_heads == 0 || !heads.is_multiple_of(*kv_heads) {
        return Err(format!("{heads} heads are not a multiple of {kv_heads} kv heads"));
    }
    let group = heads / kv_heads;
    if group == 0 || group > MAX_GROUP {
        return Err(format!(
            "a GQA group of {group} query heads per kv head exceeds the kernel's {MAX_GROUP}"
        ));
    }
    if *head_dim == 0 || *head_dim > MAX_HEAD_DIM {
        return Err(format!(
            "head_dim {head_dim} is outside the kernel's 1..={MAX_HEAD_DIM}"
        ));
    }
    if !matches!(cache.dtype, DType::F32 | DType::F16) {
        return Err(format!(
            "KV cache dtype {} (the graph's) must be f32 or f16",
            cache.dtype
        ));
    }
    Ok(KernelShape {
        head_dim: *head_dim,
        group,
    })
}

/// The scalar arguments of one dispatch (`bo0`): little-endian u32 words
/// `[abi, rows, heads, kv_heads, head_dim, capacity, window (0 = none), scale (f32 bits), slots,
/// then per row: position, slot]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnParams {
    /// Step rows.
    pub rows: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Positions kept per slot.
    pub capacity: usize,
    /// Sliding window, when the layer has one.
    pub window: Option<usize>,
    /// Multiplier of the dot products.
    pub scale: f32,
    /// Slots in the cache.
    pub slots: usize,
    /// Position of each row.
    pub positions: Vec<u32>,
    /// Slot of each row.
    pub row_slots: Vec<u32>,
}

/// A malformed parameter block (a fake device decoding what the host wrote, or a bug).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NPU attention params: {0}")]
pub struct ParamsError(pub String);

impl AttnParams {
    /// The `bo0` words.
    pub fn encode(&self) -> Vec<u32> {
        let mut w = Vec::with_capacity(PARAMS_HEADER_WORDS + 2 * self.rows);
        w.extend([
            ABI_VERSION,
            self.rows as u32,
            self.heads as u32,
            self.kv_heads as u32,
            self.head_dim as u32,
            self.capacity as u32,
            self.window.unwrap_or(0) as u32,
            self.scale.to_bits(),
            self.slots as u32,
        ]);
        for (p, s) in self.positions.iter().zip(&self.row_slots) {
            w.extend([*p, *s]);
        }
        w
    }

    /// Reads `bo0` words back, checking what a kernel would trust.
    pub fn decode(w: &[u32]) -> Result<AttnParams, ParamsError> {
        let head = w
            .get(..PARAMS_HEADER_WORDS)
            .ok_or_else(|| ParamsError(format!("{} words, the header has {PARAMS_HEADER_WORDS}", w.len())))?;
        if head[0] != ABI_VERSION {
            return Err(ParamsError(format!(
                "abi {} (this kernel speaks {ABI_VERSION})",
                head[0]
            )));
        }
        let rows = head[1] as usize;
        let need = PARAMS_HEADER_WORDS + 2 * rows;
        if w.len() < need {
            return Err(ParamsError(format!(
                "{} words for {rows} rows, {need} needed",
                w.len()
            )));
        }
        let pairs = &w[PARAMS_HEADER_WORDS..need];
        let p = AttnParams {
            rows,
            heads: head[2] as usize,
            kv_heads: head[3] as usize,
            head_dim: head[4] as usize,
            capacity: head[5] as usize,
            window: (head[6] != 0).then_some(head[6] as usize),
            scale: f32::from_bits(head[7]),
            slots: head[8] as usize,
            positions: pairs.iter().step_by(2).copied().collect(),
            row_slots: pairs.iter().skip(1).step_by(2).copied().collect(),
        };
        p.check()?;
        Ok(p)
    }

    /// The consistency a kernel relies on: heads divisible, slots in range, every visible
    /// position still in its ring.
    pub fn check(&self) -> Result<(), ParamsError> {
        let bad = |m: String| Err(ParamsError(m));
        if self.heads == 0
            || self.kv_heads == 0
            || !self.heads.is_multiple_of(self.kv_heads)
            || self.head_dim == 0
        {
            return bad(format!(
                "{} heads, {} kv heads, head_dim {}",
                self.heads, self.kv_heads, self.head_dim
            ));
        }
        if self.capacity == 0 || self.slots == 0 || self.window == Some(0) {
            return bad("capacity, slots and window must be positive".into());
        }
        if self.positions.len() != self.rows || self.row_slots.len() != self.rows {
            return bad(format!(
                "{} positions and {} slots for {} rows",
                self.positions.len(),
                self.row_slots.len(),
                self.rows
            ));
        }
        for (p, s) in self.positions.iter().zip(&self.row_slots) {
            if *s as usize >= self.slots {
                return bad(format!("slot {s} out of range 0..{}", self.slots));
            }
            let span = self.window.map_or(*p as usize + 1, |w| w.min(*p as usize + 1));
            if span > self.capacity {
                return bad(format!(
                    "position {p} sees {span} positions, the ring keeps {}",
                    self.capacity
                ));
            }
        }
        Ok(())
    }

    /// The first position row `r` sees.
    pub fn lo(&self, r: usize) -> usize {
        let p = self.positions[r] as usize;
        self.window.map_or(0, |w| (p + 1).saturating_sub(w))
    }

    /// Elements of `q` and of `out`: `rows * heads * head_dim`.
    pub fn q_elems(&self) -> usize {
        self.rows * self.heads * self.head_dim
    }

    /// Elements of one KV cache buffer: `slots * capacity * kv_heads * head_dim`.
    pub fn cache_elems(&self) -> usize {
        self.slots * self.capacity * self.kv_heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_backend_api::{BufferId, KvCacheRef, ValueId};

    #[test]
    fn bf16_rounding_is_nearest_even_like_half() {
        let mut x = 0x3f80_0000u32;
        for _ in 0..5000 {
            x = x.wrapping_mul(2_654_435_761).wrapping_add(12345);
            let v = f32::from_bits(x);
            if v.is_nan() {
                continue;
            }
            assert_eq!(bf16_round(v), half::bf16::from_f32(v).to_bits(), "{v:e}");
        }
        // Ties go to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
        assert_eq!(bf16_round(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(bf16_round(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16_to_f32(bf16_round(std::f32::consts::LOG2_E)), LOG2E_BF16);
        assert!(bf16_to_f32(bf16_round(f32::NAN)).is_nan());
    }

    fn attention(heads: usize, kv_heads: usize, head_dim: usize, softcap: Option<f32>) -> Op {
        Op::Attention {
            q: ValueId(0),
            k: ValueId(1),
            v: ValueId(2),
            cache: KvCacheRef {
                k: BufferId::UNBOUND,
                v: BufferId::UNBOUND,
                dtype: DType::F16,
                slots: 1,
                capacity: 8,
            },
            heads,
            kv_heads,
            head_dim,
            scale: 1.0,
            window: None,
            softcap,
            bidirectional_from: None,
        }
    }

    #[test]
    fn shapes_are_refused_with_the_reason() {
        assert_eq!(
            kernel_shape(&attention(4, 1, 256, None)),
            Ok(KernelShape {
                head_dim: 256,
                group: 4
            })
        );
        assert!(kernel_shape(&attention(4, 1, 256, Some(50.0)))
            .unwrap_err()
            .contains("soft-capping"));
        assert!(kernel_shape(&attention(32, 2, 128, None))
            .unwrap_err()
            .contains("group of 16"));
        assert!(kernel_shape(&attention(2, 1, 512, None))
            .unwrap_err()
            .contains("head_dim 512"));
        let add = Op::Add {
            a: ValueId(0),
            b: ValueId(1),
        };
        assert!(kernel_shape(&add).unwrap_err().contains("attention only"));
    }

    #[test]
    fn params_round_trip_and_refuse_bad_blocks() {
        let p = AttnParams {
            rows: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            capacity: 6,
            window: Some(3),
            scale: 0.125,
            slots: 2,
            positions: vec![7, 0],
            row_slots: vec![1, 0],
        };
        let w = p.encode();
        assert_eq!(
            w,
            vec![1, 2, 4, 2, 8, 6, 3, 0.125f32.to_bits(), 2, 7, 1, 0, 0],
            "the documented word order"
        );
        assert_eq!(AttnParams::decode(&w), Ok(p.clone()));
        assert!(AttnParams::decode(&w[..10]).unwrap_err().0.contains("13 needed"));
        let mut other_abi = w.clone();
        other_abi[0] = 2;
        assert!(AttnParams::decode(&other_abi).unwrap_err().0.contains("abi 2"));
        let mut bad_slot = w.clone();
        bad_slot[10] = 5;
        assert!(AttnParams::decode(&bad_slot).unwrap_err().0.contains("slot 5"));
        let mut no_window = w;
        no_window[6] = 0;
        assert!(AttnParams::decode(&no_window)
            .unwrap_err()
            .0
            .contains("ring keeps 6"));
        assert_eq!(Phase::of_step(&[0, 1, 2]), Phase::Decode);
        assert_eq!(Phase::of_step(&[0, 0, 1]), Phase::Prefill);
    }
}
