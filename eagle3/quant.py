"""The GGUF's own 4-bit weights as int4 linears: the engine computes the shipped Q4_1 model, not a re-quantised one.

A Q4_1 block holds 32 weights as 4-bit q with an fp16 scale d and minimum m: w = d*q + m. torch's CPU int4 kernel
(`_weight_int4pack_mm_for_cpu`, groups of 32) computes w = (q - 8) * scale + zero, so scale = d and zero = m + 8d map
each block exactly (the kernel keeps scale and zero in the activations' dtype, bf16). On CPUs with AMX or AVX512-VNNI
the engine's own kernel (eagle3/amx.py, eagle3/vnni.py) takes the Q4_1 blocks instead, and the lm_head's Q8_0 blocks
too (load_q8_0_lm_head); elsewhere the embedding (Q8_0 in the default GGUF, also the tied lm_head) stays dense."""
import numpy as np
import torch

# Our fused linears per layer: the GGUF tensors they stack, in row order.
_LINEARS = {"self_attn.qkv": ("attn_q", "attn_k", "attn_v"), "self_attn.o_proj": ("attn_output",),
            "mlp.gate_up": ("ffn_gate", "ffn_up"), "mlp.down_proj": ("ffn_down",)}
_Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
_Q8_0_BLOCK_BYTES = 34  # fp16 d, 32 int8


def q4_1_blocks(data: np.ndarray):
    """Raw Q4_1 rows [out, in/32 * 20] uint8 -> (q [out, in] 0..15, d [out, in/32], m [out, in/32]) as tensors.
    Within a block, byte j holds weight j in its low nibble and weight j + 16 in its high one (ggml's layout)."""
    rows = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(rows, -1, _Q4_1_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    qs = blocks[..., 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], -1).reshape(rows, -1)
    return torch.from_numpy(q.astype(np.int32)), torch.from_numpy(d.astype(np.float32)), torch.from_numpy(m.astype(np.float32))


def q8_0_blocks(data: np.ndarray):
    """Raw Q8_0 rows [out, in/32 * 34] uint8 -> (q [out, in] int8, d [out, in/32] fp32): w = d * q."""
    rows = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(rows, -1, _Q8_0_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    q = blocks[..., 2:].copy().view(np.int8).reshape(rows, -1)
    return torch.from_numpy(q), torch.from_numpy(d.astype(np.float32))


def load_q8_0_lm_head(model, gguf_path) -> bool:
    """Give the lm_head the GGUF's Q8_0 blocks (its own output tensor, else the tied embedding) where the AMX or VNNI
    kernel runs them (Linear.set_q8); returns whether it does."""
    from gguf import GGMLQuantizationType, GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(gguf_path)).tensors}
    t = tensors.get("output.weight", tensors["token_embd.weight"])
    if t.tensor_type != GGMLQuantizationType.Q8_0:
        return False
    return model.lm_head.set_q8(*q8_0_blocks(t.data))


def _unpermute_rows(n_rows, n_head):
    """llama.cpp's converter interleaves each q/k head's two rotary halves; this gives the row order that undoes it."""
    idx = np.arange(n_rows).reshape(n_head, 2, n_rows // n_head // 2).swapaxes(1, 2).reshape(-1)
    return torch.from_numpy(np.argsort(idx))


def load_q4_1(model, gguf_path) -> int:
    """Give every Linear of `model` whose GGUF tensors are all Q4_1 the GGUF's int4 weights; returns how many."""
    from gguf import GGMLQuantizationType, GGUFReader

    c = model.config
    tensors = {t.name: t for t in GGUFReader(str(gguf_path)).tensors}
    heads = {"attn_q": c.num_attention_heads, "attn_k": c.num_key_value_heads}
    done = 0
    for i, layer in enumerate(model.layers):
        for ours, theirs in _LINEARS.items():
            ts = [tensors[f"blk.{i}.{name}.weight"] for name in theirs]
            if any(t.tensor_type != GGMLQuantizationType.Q4_1 for t in ts):
                continue
            parts = []
            for name, t in zip(theirs, ts):
                q, d, m = q4_1_blocks(t.data)
                if name in heads:
                    order = _unpermute_rows(q.shape[0], heads[name])
                    q, d, m = q[order], d[order], m[order]
                parts.append((q, d, m))
            q, d, m = (torch.cat(x) for x in zip(*parts))
            layer.get_submodule(ours).set_int4(q, d, m + 8 * d)
            done += 1
    return done


def quantize_q4(linear, group=32):
    """Re-quantise a dense Linear to int4 in Q4_1's form (per group: min and 15 steps up to max). Lossy: for targets
    without a GGUF (opt-in, load_target(int4=True)), for a draft head beside a target that runs an own kernel
    (decoder.resolve_head: drafting only proposes) and for tests."""
    w = linear.weight.detach().float()
    g = w.view(w.shape[0], -1, group)
    lo, hi = g.amin(-1), g.amax(-1)
    d = ((hi - lo) / 15).clamp(min=1e-8)
    q = ((g - lo[..., None]) / d[..., None]).round().clamp(0, 15).view(w.shape)
    linear.set_int4(q.to(torch.int32), d, lo + 8 * d, group)


def quantize_layers_q4(model) -> int:
    """quantize_q4 every Linear of the model's layers (not the embedding / lm_head); returns how many."""
    done = 0
    for layer in model.layers:
        for name in _LINEARS:
            quantize_q4(layer.get_submodule(name))
            done += 1
    return done
