//! Which ops a GPU backend's kernels take: one rule for both backends, parameterised by what
//! each one's kernels cover ([`Coverage`]), answered without buffers so that `supports` and
//! `compile` agree.

use tandem_backend_api::{BackendError, DType, Graph, Op};

use crate::params::NORM_FORMATS;

/// What a backend's kernels cover.
#[derive(Debug, Clone, Copy)]
pub struct Coverage {
    /// The kernels' name in messages: `Vulkan` ("the Vulkan kernels"), `WGSL`.
    pub kernels: &'static str,
    /// Whether the embedding and matmul kernels decode weights of this format.
    pub weight_format: fn(DType) -> bool,
    /// The most output splits of one matmul.
    pub max_splits: usize,
    /// The largest attention head.
    pub max_head_dim: usize,
    /// The largest `k` of a top-k, which then must be at least 1; `None`: any.
    pub top_k_max: Option<usize>,
    /// Whether an f16 KV cache must have an even width (`kv_heads * head_dim`), its values
    /// stored two per 32-bit word.
    pub f16_kv_pairs: bool,
    /// Whether the kernels take images' rows: `Op::Embed`'s `extra` rows and `Op::Attention`'s
    /// `bidirectional_from` blocks.
    pub image_rows: bool,
    /// Whether the kernels take the vision tower's ops: `Op::LayerNorm` and `Op::Bias` (weights
    /// in f32, f16 or bf16), `Op::Gelu` and `Op::BlockAttention` (heads up to `max_head_dim`).
    pub vision_ops: bool,
}

impl Coverage {
    /// The weight formats [`Coverage::weight_format`] takes, in [`DType::ALL`]'s order.
    pub fn weight_formats(&self) -> Vec<DType> {
        DType::ALL
            .into_iter()
            .filter(|d| (self.weight_format)(*d))
            .collect()
    }
}

/// Whether `op` runs on the kernels `coverage` describes; `Err` says why not.
pub fn op_support(op: &Op, coverage: &Coverage) -> Result<(), String> {
    match op {
        Op::TopK { k, .. } => match coverage.top_k_max {
            Some(max) if *k == 0 || *k > max => Err(format!("top_k of {k} (1 to {max})")),
            _ => Ok(()),
        },
        Op::Embed { extra: Some(_), .. }
        | Op::Attention {
            bidirectional_from: Some(_),
            ..
        } if !coverage.image_rows => Err(format!(
            "{} with images' rows has no {} kernel yet (the CPU backend runs it)",
            op.kind(),
            coverage.kernels
        )),
        Op::Embed { table: w, .. } | Op::MatMul { weight: w, .. } => {
            let d = w.desc.dtype;
            if !(coverage.weight_format)(d) {
                let names: Vec<String> = coverage.weight_formats().iter().map(|d| d.to_string()).collect();
                return Err(format!(
                    "weights in {d} are not implemented by the {} kernels ({} are)",
                    coverage.kernels,
                    names.join(", ")
                ));
            }
            if let Op::MatMul { splits, .. } = op {
                if splits.len() > coverage.max_splits {
                    return Err(format!(
                        "{} output splits (at most {})",
                        splits.len(),
                        coverage.max_splits
                    ));
                }
            }
            Ok(())
        }
        Op::RmsNorm { weight, .. } => match weight.desc.dtype {
            d if NORM_FORMATS.contains(&d) => Ok(()),
            d => Err(format!("norm weights in {d} (f32, f16 or bf16 only)")),
        },
        Op::Attention {
            head_dim,
            kv_heads,
            cache,
            ..
        } => {
            if *head_dim > coverage.max_head_dim {
                return Err(format!("head_dim {head_dim} (at most {})", coverage.max_head_dim));
            }
            if coverage.f16_kv_pairs && cache.dtype == DType::F16 && !(kv_heads * head_dim).is_multiple_of(2)
            {
                return Err(format!(
                    "an f16 KV cache of odd width {} (stored two values per 32-bit word)",
                    kv_heads * head_dim
                ));
            }
            Ok(())
        }
        // The vision tower's ops (issue 58), where the kernels take them.
        Op::LayerNorm { .. } | Op::Bias { .. } | Op::Gelu { .. } | Op::BlockAttention { .. }
            if !coverage.vision_ops =>
        {
            Err(format!(
                "{} has no {} kernel yet (the CPU backend runs the vision tower's ops)",
                op.kind(),
                coverage.kernels
            ))
        }
        Op::LayerNorm { .. } | Op::Bias { .. } => match op
            .weights()
            .iter()
            .find(|w| !NORM_FORMATS.contains(&w.desc.dtype))
        {
            Some(w) => Err(format!(
                "{} weights in {} (f32, f16 or bf16 only)",
                op.kind(),
                w.desc.dtype
            )),
            None => Ok(()),
        },
        Op::BlockAttention { head_dim, .. } if *head_dim > coverage.max_head_dim => {
            Err(format!("head_dim {head_dim} (at most {})", coverage.max_head_dim))
        }
        _ => Ok(()),
    }
}

/// [`op_support`] for every node of `graph`, for `compile`: the first node refused is an
/// `Unsupported` error naming the op and the node (`node 3: head_dim 640 (at most 512)`).
pub fn check_ops(graph: &Graph, coverage: &Coverage) -> Result<(), BackendError> {
    for (i, node) in graph.nodes.iter().enumerate() {
        if let Err(reason) = op_support(&node.op, coverage) {
            return Err(BackendError::unsupported(
                node.op.name(),
                format!("node {i}: {reason}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_backend_api::{BufferId, KvCacheRef, TensorDesc, ValueId, WeightRef};

    /// The two backends' kernels as they cover ops today.
    fn vulkan() -> Coverage {
        Coverage {
            kernels: "Vulkan",
            weight_format: |d| !matches!(d, DType::Q2K | DType::Q3K | DType::Q5K),
            max_splits: 4,
            max_head_dim: 512,
            top_k_max: None,
            f16_kv_pairs: false,
            image_rows: true,
            vision_ops: true,
        }
    }

    fn wgsl() -> Coverage {
        Coverage {
            kernels: "WGSL",
            top_k_max: Some(tandem_backend_api::TOP_K_MAX),
            f16_kv_pairs: true,
            ..vulkan()
        }
    }

    fn matmul(dtype: DType, splits: Vec<usize>) -> Op {
        Op::MatMul {
            x: ValueId(0),
            weight: WeightRef {
                buffer: BufferId::UNBOUND,
                desc: TensorDesc::new(dtype, [splits.iter().sum::<usize>(), 256]),
            },
            splits,
        }
    }

    fn attention(head_dim: usize, kv_heads: usize, dtype: DType) -> Op {
        Op::Attention {
            q: ValueId(0),
            k: ValueId(1),
            v: ValueId(2),
            cache: KvCacheRef {
                k: BufferId(1),
                v: BufferId(2),
                dtype,
                slots: 1,
                capacity: 16,
            },
            heads: 2 * kv_heads,
            kv_heads,
            head_dim,
            scale: 1.0,
            window: None,
            softcap: None,
            bidirectional_from: None,
        }
    }

    #[test]
    fn unsupported_weight_formats_name_the_kernels_and_the_formats_they_take() {
        assert_eq!(
            op_support(&matmul(DType::Q5K, vec![8]), &vulkan()).unwrap_err(),
            "weights in q5_k are not implemented by the Vulkan kernels (f32, f16, bf16, q4_0, q4_1, \
             q5_0, q5_1, q8_0, q4_k, q6_k are)"
        );
        assert_eq!(
            op_support(&matmul(DType::Q2K, vec![8]), &wgsl()).unwrap_err(),
            "weights in q2_k are not implemented by the WGSL kernels (f32, f16, bf16, q4_0, q4_1, \
             q5_0, q5_1, q8_0, q4_k, q6_k are)"
        );
        assert!(op_support(&matmul(DType::Q4K, vec![8]), &vulkan()).is_ok());
    }

    #[test]
    fn too_many_splits_and_too_large_heads_are_refused() {
        let five = matmul(DType::F16, vec![1; 5]);
        assert_eq!(
            op_support(&five, &wgsl()).unwrap_err(),
            "5 output splits (at most 4)"
        );
        assert!(op_support(&matmul(DType::F16, vec![1; 4]), &wgsl()).is_ok());
        for c in [vulkan(), wgsl()] {
            assert_eq!(
                op_support(&attention(640, 1, DType::F32), &c).unwrap_err(),
                "head_dim 640 (at most 512)"
            );
            assert!(op_support(&attention(512, 1, DType::F32), &c).is_ok());
        }
    }

    #[test]
    fn odd_f16_caches_and_out_of_range_top_k_only_where_the_kernels_say() {
        let odd = attention(5, 1, DType::F16);
        assert_eq!(
            op_support(&odd, &wgsl()).unwrap_err(),
            "an f16 KV cache of odd width 5 (stored two values per 32-bit word)"
        );
        assert!(op_support(&odd, &vulkan()).is_ok());
        assert!(op_support(&attention(5, 1, DType::F32), &wgsl()).is_ok());
        let max = tandem_backend_api::TOP_K_MAX;
        let top = |k| Op::TopK { x: ValueId(0), k };
        assert_eq!(
            op_support(&top(0), &wgsl()).unwrap_err(),
            format!("top_k of 0 (1 to {max})")
        );
        assert!(op_support(&top(max + 1), &wgsl()).is_err());
        assert!(op_support(&top(max), &wgsl()).is_ok());
        assert!(op_support(&top(0), &vulkan()).is_ok());
    }

    #[test]
    fn images_rows_only_where_the_kernels_take_them() {
        let mut image_attention = attention(16, 2, DType::F16);
        if let Op::Attention {
            bidirectional_from, ..
        } = &mut image_attention
        {
            *bidirectional_from = Some(262_144);
        }
        let weight = |dtype, shape: [usize; 2]| WeightRef {
            buffer: BufferId(1),
            desc: TensorDesc::new(dtype, shape),
        };
        let embed = Op::Embed {
            table: weight(DType::Q4K, [8, 256]),
            scale: 1.0,
            extra: Some(weight(DType::F32, [3, 256])),
        };
        let refused = Coverage {
            image_rows: false,
            ..vulkan()
        };
        for op in [&image_attention, &embed] {
            assert_eq!(
                op_support(op, &refused).unwrap_err(),
                format!(
                    "{} with images' rows has no Vulkan kernel yet (the CPU backend runs it)",
                    op.kind()
                )
            );
            assert!(op_support(op, &wgsl()).is_ok(), "{op:?}");
        }
        // The table's format is still checked.
        let q2k = Op::Embed {
            table: weight(DType::Q2K, [8, 256]),
            scale: 1.0,
            extra: Some(weight(DType::F32, [3, 256])),
        };
        assert!(op_support(&q2k, &vulkan()).unwrap_err().contains("q2_k"));
    }

    #[test]
    fn vision_ops_only_where_the_kernels_take_them() {
        let w = |dtype| WeightRef {
            buffer: BufferId(1),
            desc: TensorDesc::new(dtype, [32]),
        };
        let layer_norm = |weight, bias| Op::LayerNorm {
            x: ValueId(0),
            weight: w(weight),
            bias: w(bias),
            eps: 1e-6,
        };
        let block = |head_dim| Op::BlockAttention {
            q: ValueId(0),
            k: ValueId(1),
            v: ValueId(2),
            heads: 2,
            head_dim,
            scale: 1.0,
            block: 4,
        };
        let ops = [
            layer_norm(DType::F32, DType::Bf16),
            Op::Bias {
                x: ValueId(0),
                bias: w(DType::F16),
            },
            Op::Gelu { x: ValueId(0) },
            block(72),
        ];
        let taken = vulkan();
        let refused = Coverage {
            vision_ops: false,
            ..wgsl()
        };
        for op in &ops {
            assert_eq!(
                op_support(op, &refused).unwrap_err(),
                format!(
                    "{} has no WGSL kernel yet (the CPU backend runs the vision tower's ops)",
                    op.kind()
                )
            );
            assert!(op_support(op, &taken).is_ok(), "{op:?}");
        }
        assert_eq!(
            op_support(&layer_norm(DType::F32, DType::Q8_0), &taken).unwrap_err(),
            "layer_norm weights in q8_0 (f32, f16 or bf16 only)"
        );
        assert_eq!(
            op_support(&block(640), &taken).unwrap_err(),
            "head_dim 640 (at most 512)"
        );
    }

    #[test]
    fn norm_weights_are_float_only() {
        let norm = |dtype| Op::RmsNorm {
            x: ValueId(0),
            weight: WeightRef {
                buffer: BufferId(1),
                desc: TensorDesc::new(dtype, [32]),
            },
            eps: 1e-6,
            weight_offset: 0.0,
        };
        assert!(op_support(&norm(DType::Bf16), &vulkan()).is_ok());
        assert_eq!(
            op_support(&norm(DType::Q8_0), &vulkan()).unwrap_err(),
            "norm weights in q8_0 (f32, f16 or bf16 only)"
        );
    }
}
