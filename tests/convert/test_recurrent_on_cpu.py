"""nn.LSTM exports as TFLite's fused UNIDIRECTIONAL_SEQUENCE_LSTM (convert/module/recurrent.py),
every invoke starting from a zero state (convert/module/lstm_reset.py); what stays unrolled says why."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ai_edge_litert.interpreter import Interpreter, OpResolverType
from torch import nn

import tpu_pipeline.convert as tc
from tpu_pipeline.convert.module.export import export_float
from tpu_pipeline.convert.module.gru import FusedGRU
from tpu_pipeline.convert.module.loaders import load_object
from tpu_pipeline.convert.module.lstm_int8 import full_integer
from tpu_pipeline.convert.module.lstm_reset import lstm_count
from tpu_pipeline.convert.module.lstm_weights import int8_weights
from tpu_pipeline.convert.module.recurrent import FusedLSTM, as_fused
from tpu_pipeline.convert.runtimes.litert import LitertRunner, run_micro
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.testing.recurrent_models import SequenceEncoder, sequence_task, trained

T, F, H = 12, 8, 16
UNROLLED = {"LOGISTIC", "TANH", "MUL", "ADD", "SPLIT"}  # an unrolled step's gate arithmetic


def _ops(model: bytes) -> list[str]:
    return [o["op"] for o in inspect_model(model).ops]


def _export(net: nn.Module, x: torch.Tensor, path) -> bytes:
    fused, notes = as_fused(net, (x,))
    assert fused is not net and any("UNIDIRECTIONAL_SEQUENCE_LSTM" in n for n in notes), notes
    loaded = load_object(fused, (x,))
    return export_float(loaded, path)


@pytest.mark.parametrize("bidirectional,batch_first,layers", [(False, True, 1), (True, False, 2), (False, False, 3)])
def test_fused_lstm_matches_pytorch_eager(bidirectional, batch_first, layers):
    # the module swapped in at export, against nn.LSTM itself: batched and unbatched, h_n too
    lstm = nn.LSTM(F, H, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first).eval()
    fused = FusedLSTM(lstm)
    x = torch.randn(2, T, F) if batch_first else torch.randn(T, 2, F)
    with torch.no_grad():
        (y, (h, c)), (y2, (h2, c2)) = lstm(x), fused(x)
        torch.testing.assert_close(y2, y, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(h2, h, rtol=1e-5, atol=1e-6)
        assert torch.isnan(c2).all() and c2.shape == c.shape  # never silently wrong: a model reading c_n is refused
        u = x[0] if batch_first else x[:, 0]
        torch.testing.assert_close(fused(u)[0], lstm(u)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bidirectional,batch_first,layers", [(False, True, 1), (True, False, 2)])
def test_gru_rewrite_matches_pytorch_eager(bidirectional, batch_first, layers):
    gru = nn.GRU(F, H, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first).eval()
    net = nn.Sequential(gru)
    new, notes = as_fused(net, (torch.randn(2, T, F),))
    assert type(new[0]) is FusedGRU and "nn.GRU" in notes[0]
    x = torch.randn(2, T, F) if batch_first else torch.randn(T, 2, F)
    with torch.no_grad():
        (y, h), (y2, h2) = gru(x), new[0](x)
        torch.testing.assert_close(y2, y, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(h2, h, rtol=1e-5, atol=1e-6)
        u = x[0] if batch_first else x[:, 0]
        torch.testing.assert_close(new[0](u)[0], gru(u)[0], rtol=1e-5, atol=1e-6)


class ReadsCell(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(F, H, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[1][1][-1]


class GivesState(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(F, H, batch_first=True)
        self.register_buffer("h0", torch.full((1, 1, H), 0.5))

    def forward(self, x):
        return self.lstm(x, (self.h0, self.h0))[0]


@pytest.mark.parametrize("net,why", [(ReadsCell(), "reads the cell state c_n"),
                                     (GivesState(), "passes an initial state"),
                                     (nn.Sequential(nn.LSTM(F, H, proj_size=4)), "proj_size > 0")])
def test_what_stays_unrolled_says_why(net, why):
    x = torch.randn(1, T, F)
    new, notes = as_fused(net.eval(), (x,))
    assert new is net and len(notes) == 1 and why in notes[0] and "unrolled" in notes[0], notes


@pytest.fixture(scope="module")
def speaker_like(tmp_path_factory):
    """A trained 2-layer bidirectional, time-major LSTM encoder exported fused, and its PyTorch."""
    net = trained(SequenceEncoder(F, H, 2, bidirectional=True, batch_first=False))
    x = torch.randn(1, T, F)
    return net, _export(net, x, tmp_path_factory.mktemp("lstm") / "m.tflite")


def test_the_artifact_is_fused_ops_with_no_unrolled_steps(speaker_like):
    _, model = speaker_like
    ops = _ops(model)
    # 2 layers x 2 directions, each followed by its state reset
    assert ops.count("UNIDIRECTIONAL_SEQUENCE_LSTM") == lstm_count(model) == 8
    assert not UNROLLED & set(ops), ops
    assert len(ops) <= 8 + 10, ops  # + the reversals, concatenations, the last step's slice, the projection


def test_every_invoke_starts_from_zero_state_on_litert_and_tflm(speaker_like):
    # one interpreter, several sequences in a row: without the reset, the second one was off by 0.03
    net, model = speaker_like
    xs, _ = sequence_task(4, T, F, seed=3)
    with torch.no_grad():
        want = [net(x[None]).numpy() for x in xs]
    info = inspect_model(model)
    for kind in (OpResolverType.AUTO, OpResolverType.BUILTIN_REF):
        interp = Interpreter(model_content=model, experimental_op_resolver_type=kind)
        interp.allocate_tensors()
        for x, w in zip(xs, want):
            interp.set_tensor(info.inputs[0].tensor_index, x[None].numpy())
            interp.invoke()
            np.testing.assert_allclose(interp.get_tensor(info.outputs[0].tensor_index), w, rtol=1e-4, atol=1e-5)
    got = run_micro(model, info, [[x[None].numpy()] for x in xs], 1 << 20)  # TFLM runs the float32 fused op
    for g, w in zip(got, want):
        np.testing.assert_allclose(g[0], w, rtol=1e-4, atol=1e-5)


def test_dynamic_int8_runs_the_hybrid_lstm_kernel(speaker_like):
    # ai-edge-quantizer leaves the fused op float32; int8_weights makes its 8 gate weights int8
    net, model = speaker_like
    hybrid = int8_weights(model)
    info = inspect_model(hybrid)
    types = {t["index"]: t["dtype"] for t in Interpreter(model_content=hybrid).get_tensor_details()}
    lstm = [o for o in info.ops if o["op"] == "UNIDIRECTIONAL_SEQUENCE_LSTM"]
    assert all(types[i] == np.int8 for o in lstm for i in o["inputs"][1:9]) and len(hybrid) < len(model)
    xs, _ = sequence_task(4, T, F, seed=5)
    runner = LitertRunner(hybrid, info)
    for x in xs:
        with torch.no_grad():
            want = net(x[None]).numpy().ravel()
        got = runner.run([x[None].numpy()])[0].ravel()
        assert np.dot(got, want) / np.linalg.norm(got) / np.linalg.norm(want) > 0.999


def test_static_int8_is_full_integer_lstm_on_tflm_and_every_invoke_starts_from_zero(speaker_like):
    # ai-edge-quantizer leaves the fused op float32; TFLite's calibrator makes it int8/int16, and the
    # integer resets keep a second sequence in the same interpreter as exact as the first
    net, model = speaker_like
    key = inspect_model(model).inputs[0].key
    calib, _ = sequence_task(32, T, F, seed=7)
    q = full_integer(model, [{key: x[None].numpy()} for x in calib])
    info = inspect_model(q)
    assert {t["dtype"] for t in info.tensors.values()} <= {"int8", "int16", "int32"}
    assert info.inputs[0].dtype == info.outputs[0].dtype == "int8"
    assert _ops(q).count("UNIDIRECTIONAL_SEQUENCE_LSTM") == lstm_count(q) == 8  # 4 LSTMs, 4 integer resets
    xs, _ = sequence_task(6, T, F, seed=8)
    with torch.no_grad():
        want = [net(x[None]).numpy().ravel() for x in xs]
    in_a_row = run_micro(q, info, [[x[None].numpy()] for x in xs], 1 << 20)
    assert np.array_equal(run_micro(q, info, [[xs[-1][None].numpy()]], 1 << 20)[0][0], in_a_row[-1][0])
    for got, w in zip(in_a_row, want):
        got = got[0].ravel()
        assert np.dot(got, w) / np.linalg.norm(got) / np.linalg.norm(w) > 0.99


class TextLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.rnn, self.fc = nn.Embedding(50, F), nn.LSTM(F, H, batch_first=True), nn.Linear(H, 3)

    def forward(self, ids):
        return self.fc(self.rnn(self.emb(ids))[0][:, -1])


def test_static_int8_of_an_embedding_lstm_runs_on_tflm(tmp_path):
    # token ids -> embedding -> LSTM: the lookup as int8 GATHER (TFLite's quantizer has no EMBEDDING_LOOKUP)
    torch.manual_seed(0)
    net, g = TextLSTM().eval(), torch.Generator().manual_seed(4)
    ids = [torch.randint(0, 50, (1, T), generator=g) for _ in range(24)]
    model = _export(net, ids[0], tmp_path / "text.tflite")
    key = inspect_model(model).inputs[0].key
    q = full_integer(model, [{key: x.numpy().astype(np.int32)} for x in ids[:16]])
    info = inspect_model(q)
    assert "GATHER" in _ops(q) and "float32" not in {t["dtype"] for t in info.tensors.values()}
    rows = [[x.numpy().astype(np.int32)] for x in ids[16:]]
    got = run_micro(q, info, rows, 1 << 20)
    assert np.array_equal(run_micro(q, info, rows[-1:], 1 << 20)[0][0], got[-1][0])  # reset behind a GATHER too
    with torch.no_grad():
        want = [net(x).numpy().ravel() for x in ids[16:]]
    # an untrained classifier's 3 logits sit near 0 (|x| < 0.3), where int8 error moves the cosine
    # (0.85-1.0 per row, measured): the class is what iot judges it by
    assert [int(np.argmax(a[0])) for a in got] == [int(np.argmax(w)) for w in want]


def test_op_count_does_not_grow_with_the_sequence_and_programs_fuse_too(speaker_like, tmp_path):
    # 4x the time steps, through a torch.export program (a .pt2's graph: aten.lstm, not nn.LSTM)
    net, model = speaker_like
    x = torch.randn(1, 4 * T, F)
    program = torch.export.export(net, (x,)).module()
    assert _ops(_export(program, x, tmp_path / "long.tflite")) == _ops(model)


@pytest.mark.slow
def test_convert_passes_desktop_android_web_and_iot(tmp_path):
    # desktop and android ship the fused op (float32 or dynamic int8: the hybrid LSTM kernel; float16);
    # web the unrolled graph, which LiteRT.js loads (it refuses the fused op's variable tensors);
    # iot the fused op full-integer on TFLM
    net = trained(SequenceEncoder(F, H, 1, batch_first=True))
    r = tc.convert(net, (torch.randn(1, T, F),), targets="desktop,android,web,iot", out=tmp_path / "d", samples=8,
                   latency=False)
    iot = r["iot"]
    assert iot.passed and iot.precision == "static_int8", iot.reasons
    assert iot.metrics["cosine_mean"] > 0.99
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" in _ops((tmp_path / "d" / "iot" / "model.tflite").read_bytes())
    assert any("TFLite's own calibrator" in n for n in r.report["notes"])
    # desktop measured the hybrid variant beside float32 (latency off: the first that passes ships)
    assert [c["precision"] for c in r["desktop"].candidates] == ["float32", "dynamic_int8"]
    for name in ("desktop", "android", "web"):
        t = r[name]
        assert t.passed, (name, t.reasons)
        assert t.metrics["cosine"] > (0.999 if name == "desktop" else 0.99)
        ops = _ops((tmp_path / "d" / name / "model.tflite").read_bytes())
        assert ("UNIDIRECTIONAL_SEQUENCE_LSTM" in ops) == (name != "web"), (name, ops)
    assert r["web"].precision.endswith("+unrolled") and r["web"].parity["browser"]["passed"]
    assert any("fused UNIDIRECTIONAL_SEQUENCE_LSTM" in n for n in r.report["notes"])
    assert any(n.startswith("web: its artifact keeps the LSTM unrolled") for n in r.report["notes"])


def test_stacked_steps_never_concatenate_more_than_tflm_takes():
    """issue 30: TFLM's CONCATENATION takes at most 10 inputs; a GRU's T steps are stacked in groups."""
    from tpu_pipeline.convert.module import gru as gru_module

    calls = []
    real_cat, real_stack = torch.cat, torch.stack
    steps = [torch.randn(2, 5) for _ in range(70)]
    try:
        torch.cat = lambda xs, *a, **k: calls.append(len(xs)) or real_cat(xs, *a, **k)
        torch.stack = lambda xs, *a, **k: calls.append(len(xs)) or real_stack(xs, *a, **k)
        got = gru_module.stack_steps(steps)
    finally:
        torch.cat, torch.stack = real_cat, real_stack
    torch.testing.assert_close(got, real_stack(steps, 1), rtol=0, atol=0)
    assert max(calls) <= gru_module.STACK_GROUP < 10 and len(calls) > 1


@pytest.mark.slow
def test_unrolled_lstm_fallback_runs_full_integer_on_tflm(tmp_path):
    """issue 30: an LSTM given an initial state stays litert-torch's unrolled lowering, which stacks its
    T steps in one CONCATENATION; TFLM's takes at most 10 inputs, so iot failed at every arena. The
    static int8 rewrite concatenates in groups (tflm_int8.concatenations_in_groups) and iot passes."""

    class WithH0(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(F, H, batch_first=True)
            self.h0 = nn.Parameter(0.1 * torch.randn(1, 1, H))
            self.fc = nn.Linear(H, 4)

        def forward(self, x):
            h0 = self.h0.expand(1, x.shape[0], H).contiguous()
            y, _ = self.lstm(x, (h0, torch.zeros_like(h0)))
            return self.fc(y[:, -1])

    torch.manual_seed(0)
    x, _ = sequence_task(64, 16, F)
    rows = [(x[i:i + 1],) for i in range(32, 64)]
    r = tc.convert(WithH0().eval(), (x[:1],), targets="iot", out=tmp_path / "o", latency=False, refine_rounds=0,
                   calibration=rows, samples=16)
    t = r["iot"]
    assert any("exported unrolled" in n for n in r.report["notes"])
    assert any("CONCATENATION of more than 10 inputs" in n for n in r.report["notes"] + t.warnings)
    assert t.passed, t.errors
