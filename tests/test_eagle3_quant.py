"""The engine's weight formats: the GGUF's Q4_1 blocks mapped to int4 exactly, rows computed the same at any row
count, and the dtype chosen by hardware."""
import pytest
import torch

from eagle3 import hardware
from eagle3.layers import Linear
from eagle3.quant import q4_1_blocks, quantize_q4
from eagle3.target import default_gguf, load_target


def test_q4_1_blocks_match_gguf_dequantisation():
    from gguf import GGMLQuantizationType, GGUFReader, dequantize

    t = next(t for t in GGUFReader(str(default_gguf())).tensors if t.tensor_type == GGMLQuantizationType.Q4_1)
    q, d, m = q4_1_blocks(t.data)
    ours = (q.view(q.shape[0], -1, 32).float() * d[..., None] + m[..., None]).view(q.shape)
    ref = torch.from_numpy(dequantize(t.data, t.tensor_type)).float()
    assert ours.shape == ref.shape
    assert torch.allclose(ours, ref, atol=1e-6)


def test_int4_weights_are_the_checkpoint_weights():
    """The int4 mapping (q/k rows un-permuted, q/k/v and gate/up stacked) gives exactly the weights transformers'
    own GGUF conversion gives."""
    dense = dict(load_target(dtype="float32", int4=False).model.named_parameters())
    mapped = load_target(dtype="float32", int4=True).model
    for name in ("layers.0.self_attn.qkv.weight", "layers.7.mlp.gate_up.weight", "layers.29.mlp.down_proj.weight",
                 "layers.15.self_attn.o_proj.weight"):
        assert torch.equal(dict(mapped.named_parameters())[name], dense[name]), name


def test_int4_linear_gives_each_row_the_same_bits_at_any_row_count(monkeypatch):
    """torch's int4 kernel (the engine's own ones, where a CPU has them, are tested in test_amx.py and test_vnni.py)."""
    from eagle3 import amx, vnni

    monkeypatch.setattr(amx, "available", lambda: False)
    monkeypatch.setattr(vnni, "available", lambda: False)
    torch.manual_seed(0)
    lin = Linear(256, 96).to(torch.bfloat16)
    lin.weight.data.normal_(0, 0.05)
    quantize_q4(lin)
    assert lin._int4 is not None
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        alone = torch.cat([lin(x[i: i + 1]) for i in range(64)])
        for m in (4, 16, 64):
            assert torch.equal(lin(x[:m]), alone[:m])
        dense = torch.nn.functional.linear(x.float(), lin.weight.float())
    assert torch.allclose(alone.float(), dense, atol=0.05, rtol=0.02)


def test_dtype_follows_the_hardware_and_the_override(monkeypatch):
    monkeypatch.delenv("EAGLE3_DTYPE", raising=False)
    flags = open("/proc/cpuinfo").read()
    expect = torch.bfloat16 if ("avx512_bf16" in flags or "amx_bf16" in flags) else torch.float32
    assert hardware.default_dtype("cpu") == expect
    monkeypatch.setenv("EAGLE3_DTYPE", "fp32")
    assert hardware.default_dtype("cpu") == torch.float32
    monkeypatch.setenv("EAGLE3_DTYPE", "bfloat16")
    assert hardware.default_dtype("cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        hardware.parse_dtype("int3")
    for var in hardware.NARROWING:
        monkeypatch.delenv(var, raising=False)
    assert "flags" in hardware.describe() and "narrowed" not in hardware.describe()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # a run that limits kernels says so in its report
    assert hardware.describe().endswith("kernels narrowed by ONEDNN_MAX_CPU_ISA=AVX2")


def test_int8_linear_gives_each_row_the_same_bits_at_any_row_count():
    """fbgemm's int8 GEMM with one activation scale per row (eagle3/int8.py): a row's result does not depend on the
    rows beside it, however large they are, and it stays close to the fp32 product."""
    torch.manual_seed(0)
    lin = Linear(256, 96)
    lin.weight.data.normal_(0, 0.05)
    lin.set_int8()
    x = torch.randn(300, 256) * torch.logspace(-2, 2, 300)[:, None]  # rows of very different scales
    with torch.no_grad():
        alone = torch.cat([lin(x[i: i + 1]) for i in range(len(x))])
        for m in (2, 4, 16, 64, 300):
            assert torch.equal(lin(x[:m]), alone[:m])
        assert torch.equal(lin(x[None, 7:40]), alone[None, 7:40])  # leading dims are rows too
        dense = torch.nn.functional.linear(x, lin.weight)
    err = (alone - dense).norm(dim=1) / dense.norm(dim=1)
    assert err.max() < 0.01, err.max()  # ~14-bit activations: the int8 weights' rounding is what is left


def test_int8_linear_gives_the_same_bits_compiled_and_eager():
    """Prefills run eager and decode steps compiled (eagle3/compiled.py), so the per-row scaling that inductor fuses
    must round exactly as the eager ops do."""
    torch.manual_seed(1)
    lin = Linear(256, 96)
    lin.weight.data.normal_(0, 0.05)
    lin.set_int8()
    x = torch.randn(37, 256) * torch.logspace(-3, 3, 37)[:, None]
    with torch.no_grad():
        assert torch.equal(torch.compile(lin, fullgraph=True)(x), lin(x))


def test_int8_activations_do_not_saturate_and_a_second_weight_digit_is_near_exact():
    """AVX2's int8 kernel sums pairs of u8 x s8 products in int16: 8-bit activations times weights of one sign at
    full scale would saturate. The activations' two 7-bit digits cannot; with weights int8 represents exactly, the
    product is exact to fp32 rounding. A second weight digit (the lm_head's) takes the weights' rounding error away."""
    lin = Linear(512, 64)
    lin.weight.data.fill_(0.05)
    lin.weight.data[::2] *= -1
    lin.set_int8()
    x = torch.rand(8, 512) + 1  # all large and positive
    with torch.no_grad():
        dense = torch.nn.functional.linear(x, lin.weight)
        assert torch.allclose(lin(x), dense, rtol=1e-3), (lin(x) - dense).abs().max()
        lin.weight.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
        x = torch.randn(8, 512)
        dense = torch.nn.functional.linear(x, lin.weight)
        errors = []
        for digits in (1, 2):
            lin.set_int8(digits)
            errors.append(((lin(x) - dense).norm() / dense.norm()).item())
    assert errors[1] < errors[0] / 20, errors


def test_int8_is_the_default_where_the_hardware_picks_fp32(monkeypatch):
    """Without native bf16 the engine runs fp32 with the Q4_1 layers through the VNNI kernel (its AVX2 build on CPUs
    with AVX2 alone), and int8 (fbgemm) where neither build runs, unless told otherwise: EAGLE3_INT8=0, int8=False,
    or an explicit fp32 dtype (the exact reference). Asking for int8 where fbgemm cannot run it is an error."""
    from eagle3 import hardware, vnni
    from eagle3.layers import has_int8, weight_format

    monkeypatch.delenv("EAGLE3_DTYPE", raising=False)
    monkeypatch.delenv("EAGLE3_INT8", raising=False)
    monkeypatch.delenv("EAGLE3_INT4", raising=False)
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: False)  # the hardware picks fp32
    assert weight_format(load_target().model) == (f"int4 ({vnni.label()})" if vnni.available() else "int8")
    monkeypatch.setattr(vnni, "available", lambda: False)  # EAGLE3_VNNI=0, or no compiler
    assert has_int8(load_target().model)
    assert not has_int8(load_target(int8=False).model)
    assert not has_int8(load_target(dtype="float32").model)
    monkeypatch.setenv("EAGLE3_INT8", "0")
    assert not has_int8(load_target().model)
    monkeypatch.setenv("EAGLE3_DTYPE", "float32")
    monkeypatch.setenv("EAGLE3_INT8", "1")
    assert has_int8(load_target().model)
    monkeypatch.delenv("EAGLE3_DTYPE")
    monkeypatch.delenv("EAGLE3_INT8")
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: True)  # bf16 + int4 instead
    assert not has_int8(load_target().model)
    with pytest.raises(ValueError, match="int8"):
        load_target(dtype="bfloat16", int4=False, int8=True)
