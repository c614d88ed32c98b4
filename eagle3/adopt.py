"""What SpeculativeDecoder accepts as its model: a Target, a model directory or name (load_target), or a transformers
Llama / Qwen2 / Mistral model, whose weights are taken over into our engine (target.LlamaModel).

A transformers model keeps its own dtype and device (usually float32), so greedy output equals its own
generate(do_sample=False); load_target's hardware default (bf16 on some CPUs) would not."""
import json
from pathlib import Path


from .target import HFTokenizer, Target, TargetConfig, build_model, load_target

ARCHITECTURES = ("llama", "qwen2", "mistral")  # the layouts LlamaModel computes exactly


def as_target(obj, tokenizer=None, field="model") -> Target:
    """A Target from a Target, a model directory or name, or a transformers PreTrainedModel; ValueError otherwise."""
    if isinstance(obj, (Target, str, Path)) and tokenizer is not None:
        raise ValueError("tokenizer: only for a transformers model (a Target or model directory brings its own)")
    if isinstance(obj, Target):
        if obj.model is None:
            raise ValueError(f"{field}: this Target has no weights (load_tokenizer); use load_target")
        return obj
    if isinstance(obj, (str, Path)):
        config = Path(obj) / "config.json"
        if config.exists():
            check_architecture(json.loads(config.read_text()), field)
        return load_target(str(obj))
    from transformers import PreTrainedModel

    if isinstance(obj, PreTrainedModel):
        return target_from_hf(obj, tokenizer)
    raise ValueError(f"{field}: expected a transformers Llama / Qwen2 / Mistral model, a model directory or name, "
                     f"or a Target; got {type(obj).__name__}")


def check_architecture(config: dict, field="model"):
    """ValueError unless the config describes a model LlamaModel computes exactly (a HF config as a dict)."""
    kind = config.get("model_type")
    if kind not in ARCHITECTURES:
        raise ValueError(f"{field}: {kind!r} models are not supported; Llama, Qwen2 and Mistral models are")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    unsupported = {
        "quantized weights": config.get("quantization_config") is not None,
        f"activation {config.get('hidden_act')!r}": config.get("hidden_act", "silu") != "silu",
        "MLP biases": bool(config.get("mlp_bias")),
        "an output projection bias": kind != "qwen2" and bool(config.get("attention_bias")),
        f"rope scaling {rope_type!r}": rope_type != "default",
        "sliding-window attention": kind == "qwen2" and bool(config.get("use_sliding_window")),
    }
    for what, present in unsupported.items():
        if present:
            raise ValueError(f"{field}: this {kind} model has {what}, which the engine does not implement")


def target_from_hf(model, tokenizer=None, max_context=None) -> Target:
    """Our engine with a transformers causal LM's weights (q/k/v and gate/up fused into new tensors, the others
    shared with the model), in the model's own dtype and on its device.

    tokenizer: a transformers tokenizer or its directory; None loads it from the model's name_or_path (a local
    directory, or a hub name already in the local cache)."""
    # Options left unset (None) count as absent, as in a saved config.json: from_hf's defaults apply to them.
    hf = {k: v for k, v in model.config.to_dict().items() if v is not None}
    check_architecture(hf)
    if model.get_output_embeddings() is None:
        raise ValueError("model: a causal LM with its output layer is needed (…ForCausalLM), not the bare model")
    config = TargetConfig.from_hf(hf)
    config.eos_token_ids = sorted(set(config.eos_token_ids) | set(_ids(model.generation_config.eos_token_id)))
    w = model.get_input_embeddings().weight
    try:
        engine = build_model(config, model.state_dict(), w.device, w.dtype)
    except RuntimeError as e:
        raise ValueError(f"model: its weights do not fit the {hf['model_type']} layout: {e}") from None
    tok = _tokenizer(model, tokenizer, config.vocab_size)
    # Mistral attends to a sliding window: within it that is full attention, which is what the engine does.
    window = hf.get("sliding_window") if hf["model_type"] == "mistral" else None
    name = Path(model.name_or_path).name if model.name_or_path else hf["model_type"]  # picks the shipped head, if any
    return Target(engine, tok, name, min((x for x in (max_context, window) if x), default=None))


class _LoadedTokenizer(HFTokenizer):
    """HFTokenizer around a transformers tokenizer that is already loaded."""

    def __init__(self, tok):
        self.tok = tok


def _tokenizer(model, tokenizer, vocab_size):
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    if tokenizer is None:
        if not model.name_or_path:
            raise ValueError("tokenizer: the model has no name_or_path to load its tokenizer from; pass tokenizer=")
        try:
            tokenizer = AutoTokenizer.from_pretrained(model.name_or_path, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ValueError(f"tokenizer: none found at {model.name_or_path!r} ({e}); pass tokenizer=") from None
    elif isinstance(tokenizer, (str, Path)):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise ValueError(f"tokenizer: expected a transformers tokenizer or its directory, "
                         f"got {type(tokenizer).__name__}")
    if len(tokenizer) > vocab_size:
        raise ValueError(f"tokenizer: {len(tokenizer)} tokens, more than the model's vocabulary ({vocab_size})")
    return _LoadedTokenizer(tokenizer)


def _ids(x):
    return [] if x is None else [x] if isinstance(x, int) else list(x)
