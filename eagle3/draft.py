"""The EAGLE-3 draft head, in the layout of the released SafeAILab EAGLE-3 checkpoints.

Tensors: fc [hidden, 3*target_hidden]; midlayer.{hidden_norm,input_layernorm,post_attention_layernorm};
midlayer.self_attn.{q,k,v,o}_proj (q/k/v read 2*hidden: concat(token embedding, hidden)); midlayer.mlp.*; norm;
lm_head [draft_vocab, hidden]; d2t (draft id -> target id offset) and t2d (target id in draft vocab?). The token
embedding is the target's, frozen, so the head has none of its own.

EAGLE 3.1 (config flags `fc_norm`, `norm_output`; both absent = off = plain EAGLE-3): `fc_norm.{0,1,2}` RMSNorm each
of the low/mid/high target features before `fc`, and each step hands on its post-`norm` output instead of the
pre-norm one (so the next step's input and the logits read the same normalised state)."""
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from . import compiled
from .layers import MLP, KVCache, Linear, RMSNorm, Rope, attend, attention_mask, cache_dtype, pack_linears


@dataclass
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    num_hidden_layers: int = 1
    # EAGLE 3.1. The names are the ones vLLM (model_executor/models/llama_eagle3.py reads getattr(config, "fc_norm")
    # and "norm_output"; its speculators config updater defaults both to False) and vllm-project/speculators
    # (models/eagle3/config.py, convert/eagle/eagle3_converter.py reads them from an EAGLE-layout config.json) use,
    # with the per-feature norms stored as fc_norm.{0,1,2}.weight. Absent from a config = off: older heads load
    # unchanged.
    fc_norm: bool = False
    norm_output: bool = False

    def __post_init__(self):
        self.target_hidden_size = self.target_hidden_size or self.hidden_size
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, d: dict):
        names = set(cls.__dataclass_fields__)
        d = dict(d)
        d.setdefault("draft_vocab_size", d["vocab_size"])
        if "rope_theta" not in d and isinstance(d.get("rope_parameters"), dict):
            d["rope_theta"] = d["rope_parameters"].get("rope_theta", 10000.0)
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})

    def to_dict(self):
        return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
                "tie_word_embeddings": False, **asdict(self)}

    @classmethod
    def for_target(cls, tc, draft_vocab_size=None):
        return cls(hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                   num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
                   vocab_size=tc.vocab_size, draft_vocab_size=draft_vocab_size or tc.vocab_size,
                   head_dim=tc.head_dim, rms_norm_eps=tc.rms_norm_eps, rope_theta=tc.rope_theta,
                   max_position_embeddings=tc.max_position_embeddings)


class HeadAttention(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.hq, self.hkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = Linear(2 * c.hidden_size, self.hq * self.d)
        self.k_proj = Linear(2 * c.hidden_size, self.hkv * self.d)
        self.v_proj = Linear(2 * c.hidden_size, self.hkv * self.d)
        self.o_proj = Linear(self.hq * self.d, c.hidden_size)

    def forward(self, x, positions, rope, k, v, mask):
        """x [B, T, 2*hidden]; k/v [B, Hkv, S, D]: the head's cache (read only); mask [B, 1, T, S + T] over those
        slots and then the T new keys. Returns the output and the new keys and values [B, Hkv, T, D]."""
        B, T, _ = x.shape
        dt = k.dtype  # attention runs in the cache's dtype, as the target's does (layers.cache_dtype)
        q = self.q_proj(x).to(dt).view(B, T, self.hq, self.d).transpose(1, 2)
        kk = self.k_proj(x).to(dt).view(B, T, self.hkv, self.d).transpose(1, 2)
        vv = self.v_proj(x).to(dt).view(B, T, self.hkv, self.d).transpose(1, 2)
        q, kk = rope(q, kk, positions)
        out = attend(q, k, v, mask, kk, vv).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(out.to(x.dtype)), kk, vv


class MidLayer(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = HeadAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)

    def forward(self, emb, hidden, positions, rope, k, v, mask):
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], -1)
        a, new_k, new_v = self.self_attn(x, positions, rope, k, v, mask)
        h = hidden + a
        return h + self.mlp(self.post_attention_layernorm(h)), new_k, new_v


class Eagle3Head(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.config = c
        self.fc = Linear(3 * c.target_hidden_size, c.hidden_size)
        if c.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(c.target_hidden_size, c.rms_norm_eps) for _ in range(3))
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = Linear(c.hidden_size, c.draft_vocab_size)
        self.rope = Rope(c.head_dim, c.rope_theta, c.max_position_embeddings)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool) if c.draft_vocab_size == c.vocab_size
                             else torch.zeros(c.vocab_size, dtype=torch.bool))

    # ------------------------------------------------------------ construction / checkpoints

    @classmethod
    def random(cls, c: HeadConfig, seed=0, scale=0.02):
        g = torch.Generator().manual_seed(seed)
        head = cls(c)
        for name, p in head.named_parameters():
            if "norm" not in name:
                p.data = torch.randn(p.shape, generator=g) * scale
        return head

    def set_vocab(self, draft_to_target: torch.Tensor):
        """Use the given target ids (sorted, draft_vocab_size of them) as the draft vocabulary."""
        ids = draft_to_target.long().sort().values
        assert ids.numel() == self.config.draft_vocab_size
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    def to_target_ids(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]

    def new_cache(self, batch, max_len):
        c, w = self.config, self.fc.weight
        return KVCache(1, batch, c.num_key_value_heads, max_len, c.head_dim, cache_dtype(w, c.head_dim), w.device)

    def save_pretrained(self, path, dtype=torch.float16):
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in self.state_dict().items()}
        if self.config.draft_vocab_size == self.config.vocab_size:  # released heads omit the maps then
            sd.pop("d2t"), sd.pop("t2d")
        save_file(sd, str(path / "model.safetensors"))
        (path / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2))

    @classmethod
    def from_pretrained(cls, path, device="cpu", dtype=torch.float32):
        path = Path(path)
        c = HeadConfig.from_dict(json.loads((path / "config.json").read_text()))
        st = path / "model.safetensors"
        sd = load_file(str(st)) if st.exists() else torch.load(path / "pytorch_model.bin", map_location="cpu",
                                                                weights_only=True)
        sd.pop("embed_tokens.weight", None)  # some releases ship a copy of the target's embedding; we use the target's
        with torch.device("meta"):
            head = cls(c)
        sd.setdefault("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))  # absent: full vocabulary
        sd.setdefault("t2d", torch.ones(c.vocab_size, dtype=torch.bool))
        sd["t2d"] = sd["t2d"].bool()
        head.load_state_dict(sd, strict=True, assign=True)
        return head.to(device=device, dtype=dtype).eval()

    def pack(self):
        return pack_linears(self)

    # ------------------------------------------------------------ forward

    def forward(self, emb, hidden, positions, cache, tree_mask, offset=0):
        """One head step over T inputs per row: emb [B, T, h] token embeddings, hidden [B, T, h] (fc of target
        features, or the head's own previous output). K/V go to slots cache.lens + offset + 0..T-1; tree_mask
        [B, T, offset+T] says which of the block's slots each input sees. Returns the output [B, T, h] the next step
        reads (`output`: pre-norm, or post-norm under norm_output).

        The step reads the cache's first max(lens) + offset slots and writes its new K/V after the call, so it is
        a pure function of its inputs: within compiled_steps() it runs as one compiled graph (eagle3/compiled.py's
        head_step), which saves most of its ~60 eager ops' overhead three times a tree round."""
        T = emb.shape[1]
        # At least 2 slots read (those past a row's lens are masked): a compiled graph then needs no variants for
        # an empty cache (a new row's catch-up) or a one-slot one
        mask = step_mask(cache.lens, tree_mask, max(int(cache.lens.max()) + offset, 2), offset)
        # The whole cache and contiguous inputs (drafting passes stride-0 ones), so that a compiled graph sees the
        # same strides on every call
        out, new_k, new_v = compiled.head_step(self, emb, hidden.contiguous(), positions.contiguous(), cache.k[0],
                                               cache.v[0], mask)
        cache.write(0, new_k, new_v, cache.slots(offset, T))
        return out

    @torch.no_grad()
    def warm(self, rows):
        """Compile (or load from inductor's cache) the graphs of compiled.head_step that drafting `rows` rows will
        run: one new input and several, over a cache of rows + 1 rows and over the view of `rows` rows that a
        finished row leaves (KVCache.keep), so no round pays for a compile."""
        h, dev, dt = self.config.hidden_size, self.fc.weight.device, self.fc.weight.dtype  # the drafters' inputs'
        cache = self.new_cache(rows + 1, 16)
        cache.lens[:] = 4
        for n in (rows + 1, rows):
            if n == rows:
                cache.keep(list(range(rows)))
            for T in (1, 2):
                x = torch.zeros(n, T, h, dtype=dt, device=dev)
                pos = (4 + torch.arange(T, device=dev)).expand(n, T)
                with compiled.compiled_steps(True):
                    self(x, x.clone(), pos, cache, torch.ones(T, T, dtype=torch.bool, device=dev).tril().expand(n, T, T))

    def step(self, emb, hidden, positions, k, v, mask):
        """forward's work without writing the cache: k/v [B, Hkv, max_len, D], of which the mask's first S slots
        are read. Returns (output, new keys, new values)."""
        S = mask.shape[-1] - emb.shape[1]
        h, new_k, new_v = self.midlayer(emb, hidden, positions, self.rope, k[:, :, :S], v[:, :, :S], mask)
        return self.output(h), new_k, new_v

    def project(self, feats):
        """fc over the concatenated low/mid/high target features [.., 3*target_hidden]; under fc_norm each of the
        three is RMS-normalised first, so layers of very different scale reach fc alike."""
        if self.config.fc_norm:  # in the head's dtype, as fc would read them (the target's stream may be wider)
            feats = feats.to(self.fc.weight.dtype)
            feats = torch.cat([norm(f) for norm, f in zip(self.fc_norm, feats.chunk(3, -1))], -1)
        return self.fc(feats)

    def output(self, h):
        """What a step hands on (to the next step and to `logits`): the layer's output, or under norm_output its
        post-norm value."""
        return self.norm(h) if self.config.norm_output else h

    def logits(self, out):
        """Logits over the draft vocabulary from what forward returned (already normalised under norm_output)."""
        return self.lm_head(out if self.config.norm_output else self.norm(out))


def step_mask(lens, tree_mask, S, offset):
    """[B, 1, T, S + T] for a head step: query i of row b sees the committed slots < lens[b] of the cache's first S,
    the block's earlier slots lens[b] + j (j < offset) that tree_mask[b, i, j] allows, and the new keys (placed after
    the S slots) that tree_mask[b, i, offset:] allows."""
    if not offset:  # the target's compiled forward has the same layout
        return compiled.block_mask(lens, tree_mask, S)
    seen = attention_mask(lens, tree_mask[:, :, :offset], S)[:, 0]
    return torch.cat([seen, tree_mask[:, :, offset:]], 2).unsqueeze(1)
