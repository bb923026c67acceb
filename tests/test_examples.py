"""Tests for inferd.examples: deterministic ONNX builders and the example repository."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from inferd.examples import build, onnx_models as om


def _session(model: onnx.ModelProto | str | os.PathLike[str]) -> ort.InferenceSession:
    src = om.serialize(model) if isinstance(model, onnx.ModelProto) else os.fspath(model)
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"])


def _snapshot(root) -> dict[str, tuple[int, bytes]]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = (os.stat(p).st_mtime_ns, fh.read())
    return out


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("model_repository")
    (root / "keep_me.txt").write_text("not ours")
    (root / "other_model").mkdir()
    (root / "other_model" / "config.pbtxt").write_text('name: "other_model"\n')
    result = build.build_repository(root, log=None)
    assert set(result) == {s.name for s in build.MODELS}
    assert all(result.values()), result
    return root


EXPECTED_MODELS = {"simple", "add_sub", "identity_fp32", "simple_string", "mlp", "mlp_nobatch"}


def test_layout(repo):
    names = {s.name for s in build.MODELS}
    assert EXPECTED_MODELS <= names
    for name in names:
        assert (repo / name / "config.pbtxt").is_file()
    for spec in build.MODELS:  # every file of every model (model.onnx, model.pt, model.py, ...)
        for rel in spec.files:
            assert (repo / spec.name / rel).is_file()
    # Nothing else removed.
    assert (repo / "keep_me.txt").read_text() == "not ours"
    assert (repo / "other_model" / "config.pbtxt").is_file()


def test_second_build_is_noop(repo, capsys):
    before = _snapshot(repo)
    assert build.main(["--output", str(repo)]) == 0
    after = _snapshot(repo)
    assert before == after  # same bytes and same mtimes
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(build.MODELS)
    assert all("unchanged" in line for line in lines)


def test_build_is_deterministic(repo, tmp_path):
    build.build_repository(tmp_path, log=None)
    for spec in build.MODELS:
        for rel in ["config.pbtxt", *spec.files]:
            assert (tmp_path / spec.name / rel).read_bytes() == (repo / spec.name / rel).read_bytes()


def test_rewrites_changed_file_only(tmp_path):
    build.build_repository(tmp_path, only=["simple"], log=None)
    onnx_path = tmp_path / "simple" / "1" / "model.onnx"
    onnx_path.write_bytes(b"corrupt")
    written = build.build_repository(tmp_path, only=["simple"], log=None)
    assert written == {"simple": ["1/model.onnx"]}
    assert onnx.load(str(onnx_path)).graph.name == "add_sub"
    with pytest.raises(ValueError):
        build.build_repository(tmp_path, only=["nope"], log=None)


def test_configs_are_valid_triton(repo):
    pytest.importorskip("tritonclient.grpc")
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    configs = {}
    for spec in build.MODELS:
        cfg = text_format.Parse((repo / spec.name / "config.pbtxt").read_text(), mc.ModelConfig())
        assert cfg.name == spec.name
        if "1/model.onnx" in spec.files:
            assert cfg.platform == "onnxruntime_onnx"
        if cfg.platform == "ensemble":  # an ensemble may not carry instance_group
            assert not cfg.instance_group and cfg.ensemble_scheduling.step
        else:
            assert [g.kind for g in cfg.instance_group] == [mc.ModelInstanceGroup.KIND_CPU]
        configs[spec.name] = cfg

    s = configs["simple"]
    assert s.max_batch_size == 8 and s.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in s.input] == [
        ("INPUT0", mc.TYPE_INT32, [16]),
        ("INPUT1", mc.TYPE_INT32, [16]),
    ]
    assert [o.name for o in s.output] == ["OUTPUT0", "OUTPUT1"]
    a = configs["add_sub"]
    assert a.max_batch_size == 0 and not a.HasField("dynamic_batching")
    assert list(a.input[0].dims) == [16]
    i = configs["identity_fp32"]
    assert i.max_batch_size == 64 and list(i.input[0].dims) == [-1] and i.HasField("dynamic_batching")
    st = configs["simple_string"]
    assert st.max_batch_size == 8 and st.input[0].data_type == mc.TYPE_STRING
    assert st.output[0].data_type == mc.TYPE_STRING
    m = configs["mlp"]
    assert m.max_batch_size == 64 and m.HasField("dynamic_batching")
    assert m.dynamic_batching.max_queue_delay_microseconds == 0
    assert (m.input[0].name, list(m.input[0].dims)) == ("INPUT0", [256])
    assert (m.output[0].name, list(m.output[0].dims)) == ("OUTPUT0", [256])
    nb = configs["mlp_nobatch"]
    assert nb.max_batch_size == 64 and not nb.HasField("dynamic_batching")


def test_onnx_versions(repo):
    for spec in (s for s in build.MODELS if "1/model.onnx" in s.files):
        model = onnx.load(str(repo / spec.name / "1" / "model.onnx"))
        assert model.ir_version == om.IR_VERSION
        assert [(o.domain, o.version) for o in model.opset_import] == [("", om.OPSET)]
        onnx.checker.check_model(model, full_check=True)


# --------------------------------------------------------------------------- numerics of repo models


def test_simple_and_add_sub(repo):
    rng = np.random.default_rng(1)
    a = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    o0, o1 = _session(repo / "simple" / "1" / "model.onnx").run(
        ["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b}
    )
    np.testing.assert_array_equal(o0, a + b)
    np.testing.assert_array_equal(o1, a - b)
    assert o0.dtype == np.int32

    sess = _session(repo / "add_sub" / "1" / "model.onnx")
    assert sess.get_inputs()[0].shape == [16]
    o0, o1 = sess.run(None, {"INPUT0": a[0], "INPUT1": b[0]})
    np.testing.assert_array_equal(o0, a[0] + b[0])
    np.testing.assert_array_equal(o1, a[0] - b[0])


def test_identity_fp32_and_string(repo):
    x = np.random.default_rng(2).standard_normal((5, 7)).astype(np.float32)
    (y,) = _session(repo / "identity_fp32" / "1" / "model.onnx").run(None, {"INPUT0": x})
    np.testing.assert_array_equal(y, x)

    s = np.array([[f"s{i}-é" for i in range(16)], [str(i) for i in range(16)]], dtype=object)
    (y,) = _session(repo / "simple_string" / "1" / "model.onnx").run(None, {"INPUT0": s})
    assert y.shape == (2, 16) and y.tolist() == s.tolist()


def test_mlp_matches_numpy(repo):
    w = om.mlp_weights(256, 1024, 256, seed=0)
    x = np.random.default_rng(3).standard_normal((9, 256)).astype(np.float32)
    ref = om.mlp_reference(x, w)
    for name in ("mlp", "mlp_nobatch"):
        (y,) = _session(repo / name / "1" / "model.onnx").run(None, {"INPUT0": x})
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    # Same weights in both copies.
    assert (repo / "mlp" / "1" / "model.onnx").read_bytes() == (
        repo / "mlp_nobatch" / "1" / "model.onnx"
    ).read_bytes()
    # ~1/sqrt(fan_in) scaling keeps activations O(1).
    assert 0.1 < float(np.std(ref)) < 10


# --------------------------------------------------------------------------- builders


IDENTITY_DTYPES = [
    np.bool_, np.uint8, np.uint16, np.uint32, np.uint64,
    np.int8, np.int16, np.int32, np.int64,
    np.float16, np.float32, np.float64, object,
]


@pytest.mark.parametrize("dtype", IDENTITY_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("batch", [True, False])
def test_identity_every_dtype(dtype, batch):
    rng = np.random.default_rng(4)
    shape = (3, 4) if batch else (4,)
    if dtype is object:
        x = np.array([f"v{v}" for v in rng.integers(0, 99, int(np.prod(shape)))], dtype=object)
        x = x.reshape(shape)
    elif dtype is np.bool_:
        x = rng.integers(0, 2, shape).astype(bool)
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    else:
        x = rng.standard_normal(shape).astype(dtype)
    model = om.identity(dtype, [4], batch=batch, name_in="IN", name_out="OUT")
    sess = _session(model)
    assert sess.get_inputs()[0].name == "IN"
    assert sess.get_inputs()[0].shape == (["batch", 4] if batch else [4])
    (y,) = sess.run(["OUT"], {"IN": x})
    assert y.shape == x.shape
    if dtype is object:
        assert y.tolist() == x.tolist()
    else:
        assert y.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(y, x)


def test_identity_bfloat16():
    model = om.identity(np.float32, [-1], bfloat16=True)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
    assert om.identity("bfloat16", [-1]).graph.input[0].type.tensor_type.elem_type == (
        onnx.TensorProto.BFLOAT16
    )
    sess = _session(model)
    assert sess.get_inputs()[0].type == "tensor(bfloat16)"
    # numpy has no bf16: feed raw bf16 bit patterns as uint16.
    bits = (np.array([[1.0, -2.5, 3.0e3, 0.0]], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    # OrtValue.numpy() can't return bf16, so bind a preallocated uint16 buffer as the output.
    out = np.zeros_like(bits)
    binding = sess.io_binding()
    bf16 = onnx.TensorProto.BFLOAT16
    binding.bind_ortvalue_input("INPUT0", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, bf16))
    binding.bind_ortvalue_output("OUTPUT0", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, bf16))
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(out, bits)
    assert out.any()


def test_add_sub_float_nobatch():
    a = np.linspace(-1, 1, 8, dtype=np.float32)
    b = np.full(8, 0.5, np.float32)
    o0, o1 = _session(om.add_sub(np.float32, 8, batch=False)).run(None, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_allclose(o0, a + b)
    np.testing.assert_allclose(o1, a - b)


def test_scale_relu_fused():
    d_in, hidden, d_out, factor, seed = 32, 64, 16, 1.5, 7
    x = np.random.default_rng(5).standard_normal((6, d_in)).astype(np.float32)
    (s,) = _session(om.scale(d_in, factor)).run(None, {"INPUT0": x})
    np.testing.assert_allclose(s, x * np.float32(factor), rtol=1e-6)
    (m,) = _session(om.mlp(d_in, hidden, d_out, seed=seed)).run(None, {"INPUT0": s})
    np.testing.assert_allclose(
        m, om.mlp_reference(s, om.mlp_weights(d_in, hidden, d_out, seed)), rtol=1e-4, atol=1e-4
    )
    (r,) = _session(om.relu(d_out)).run(None, {"INPUT0": m})
    np.testing.assert_array_equal(r, np.maximum(m, 0))
    (f,) = _session(om.fused_scale_mlp_relu(d_in, hidden, d_out, factor, seed)).run(
        None, {"INPUT0": x}
    )
    np.testing.assert_allclose(f, r, rtol=1e-5, atol=1e-5)
    assert (r == 0).any() and (r > 0).any()


def test_builders_deterministic_and_seeded():
    assert om.serialize(om.mlp(8, 16, 4, seed=1)) == om.serialize(om.mlp(8, 16, 4, seed=1))
    assert om.serialize(om.mlp(8, 16, 4, seed=1)) != om.serialize(om.mlp(8, 16, 4, seed=2))
    w = om.mlp_weights(256, 1024, 256)
    assert all(v.dtype == np.float32 for v in w.values())
    assert abs(float(np.std(w["W1"])) - 1 / 16) < 0.005


def test_save_skips_identical(tmp_path):
    p = tmp_path / "sub" / "m.onnx"
    assert om.save(om.relu(4), p) is True
    mtime = p.stat().st_mtime_ns
    assert om.save(om.relu(4), p) is False
    assert p.stat().st_mtime_ns == mtime
    assert om.save(om.relu(5), p) is True
    assert not [f for f in os.listdir(p.parent) if f.startswith(".tmp-")]


def test_triton_example_repository_computes_what_tritons_does(tmp_path):
    """Triton's docs/examples/model_repository, built in code: its eight models, and the
    ONNX graphs compute what Triton's do (the example clients check these values)."""
    from inferd.examples import triton_examples

    names = triton_examples.build(tmp_path)
    assert sorted(names) == ["densenet_onnx", "inception_onnx", "simple", "simple_dyna_sequence", "simple_identity",
                             "simple_int8", "simple_sequence", "simple_string"]
    a = np.array([[str(i) for i in range(16)]], dtype=object)  # onnxruntime's own API takes str
    b = np.array([["1"] * 16], dtype=object)
    out = _session(tmp_path / "simple_string" / "1" / "model.onnx").run(None, {"INPUT0": a, "INPUT1": b})
    assert list(out[0][0]) == [str(i + 1) for i in range(16)] and list(out[1][0]) == [str(i - 1) for i in range(16)]
    one = np.ones((1, 1), dtype=np.int32)
    seq = _session(tmp_path / "simple_sequence" / "1" / "model.onnx")
    assert seq.run(None, {"INPUT": one * 100, "START": one, "READY": one})[0].tolist() == [[101]]
    dyna = _session(tmp_path / "simple_dyna_sequence" / "1" / "model.onnx")
    feeds = {"INPUT": one * 5, "START": one * 0, "END": one, "READY": one, "CORRID": np.array([[1000]], np.uint64)}
    assert dyna.run(None, feeds)[0].tolist() == [[1005]]
    image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    scores = _session(tmp_path / "densenet_onnx" / "1" / "model.onnx").run(None, {"data_0": image})[0]
    assert scores.shape == (1, 1000, 1, 1) and abs(float(scores.sum()) - 1.0) < 1e-4
    labels = (tmp_path / "densenet_onnx" / "densenet_labels.txt").read_text().splitlines()
    assert len(labels) == 1000


# -- inferd examples (the user command; the example repository ships in the wheel) -------------


def test_inferd_examples_writes_the_chosen_models_and_lists_them(tmp_path, capsys):
    from inferd import cli

    assert cli.main(["examples", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == [spec.name for spec in build.MODELS] and "simple" in listed
    assert cli.main(["examples", "--output", str(tmp_path), "--model", "simple"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["simple"]
    assert (tmp_path / "simple" / "1" / "model.onnx").is_file() and (tmp_path / "simple" / "config.pbtxt").is_file()


@pytest.mark.parametrize("argv, words", [
    (["examples"], "--output DIR is required"),
    (["examples", "-o", "x", "--model", "no_such_model"], "no_such_model"),
    (["examples", "-o", "x", "--triton", "--model", "simple"], "--triton writes Triton's whole example repository"),
    (["examples", "-o", "x", "--with-repeat"], "--with-repeat applies to --triton"),
])
def test_inferd_examples_refuses_what_it_cannot_do_saying_why(argv, words, capsys):
    from inferd import cli

    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2 and words in capsys.readouterr().err
