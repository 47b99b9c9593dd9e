"""Model specs: a Hugging Face `config.json`, from a folder or from the model
configs shipped by the optional aiconfigurator-core package (database names
such as `Qwen/Qwen3-32B`). Only the shapes that size weights and KV are read.
"""

import importlib.util
import json
import os

import attrs

from servesim.deployment.model_names import MODEL_ALIASES, nearest_names, resolve_model_name
from servesim.errors import InputError

# weight bytes per parameter of the linear layers, by `quantization`
WEIGHT_BYTES = {None: 2.0, "fp8": 1.0}
# bytes per KV element, by `kv_cache_dtype` (vLLM's names, then SGLang's)
KV_BYTES = {"auto": 2, "fp8": 1, "bf16": 2, "bfloat16": 2, "fp8_e4m3": 1}


@attrs.frozen
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    dense_layers: int = 0  # leading dense layers of a MoE model
    kv_lora_rank: int = 0  # MLA
    qk_rope_head_dim: int = 0
    sliding_window: int = 0
    config_quantization: str | None = None  # quantization named in config.json
    derived_max_model_len: int = 131072  # the context length; derived_max_model_len()
    # the context length as SGLang derives it; sglang_context_length()
    sglang_context_length: int = 2048
    # a vision encoder beside the text model (config.json's vision_config);
    # its weights are not counted here
    has_vision: bool = False
    # MTP layers (vLLM's `n_predict` for `method: mtp`): num_nextn_predict_layers,
    # or Qwen3.5's mtp_num_hidden_layers; 0: the model has none
    mtp_layers: int = 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def parameters(self) -> dict:
        """Parameter counts: `embedding` (input + output), `attention`,
        `dense_mlp`, `experts` (routed), `shared` (shared experts, router,
        norms), all layers together."""
        h = self.hidden_size
        attn = h * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        dense = 3 * h * self.intermediate_size
        moe_layers = self.num_layers - self.dense_layers if self.num_experts else 0
        experts = moe_layers * self.num_experts * 3 * h * self.moe_intermediate_size
        shared = moe_layers * (3 * h * self.shared_expert_intermediate_size + h * self.num_experts)
        shared += self.num_layers * 2 * h
        embedding = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        dense_layers = self.num_layers - moe_layers
        return {"embedding": embedding, "attention": self.num_layers * attn,
                "dense_mlp": dense_layers * dense, "experts": experts, "shared": shared}


_BUNDLED = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "models")


def _database_dir():
    """The model-config folder of aiconfigurator-core, or None (found without
    importing the package)."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "model_configs")
    return path if os.path.isdir(path) else None


def _config_file(folder, model: str) -> str:
    return os.path.join(folder, model.replace("/", "--", 1) + "_config.json")


def database_models() -> list:
    """Model names with a config in the package (empty without it)."""
    folder = _database_dir()
    if folder is None:
        return []
    suffix = "_config.json"
    return sorted(name[: -len(suffix)].replace("--", "/", 1) for name in os.listdir(folder)
                  if name.endswith(suffix) and not name.endswith("_hf_quant_config.json"))


def config_path(model: str, where: str = "engine.model") -> str:
    """The config.json of `model`: a folder holding one, or a database name."""
    if os.path.isdir(model):
        path = os.path.join(model, "config.json")
        if not os.path.isfile(path):
            raise InputError(f"{where}: folder {model} has no config.json")
        return path
    folder = _database_dir()
    if folder is None:
        bundled = _config_file(_BUNDLED, resolve_model_name(model))
        if os.path.isfile(bundled):  # servesim/data/README.md
            return bundled
        raise InputError(
            f"{where}: {model!r} is not a folder with a config.json, and database model names "
            "need the optional package aiconfigurator-core (pip install 'servesim[aic]')")
    path = _config_file(folder, resolve_model_name(model))
    if not os.path.isfile(path):
        known = database_models() + list(MODEL_ALIASES)
        near = nearest_names(model, known)
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        raise InputError(f"{where}: unknown model {model!r}; {hint}`servesim models` lists the "
                         f"{len(database_models())} database models and their aliases")
    return path


_LOADED = {}  # (name, path, mtime, size) -> ModelSpec: each config.json read once per process


def load_model_spec(model: str, where: str = "engine.model") -> ModelSpec:
    """The spec of `model` from its config.json, read once per process (again
    if the file changed); a malformed file is an InputError naming it."""
    path = config_path(model, where)
    try:
        stat = os.stat(path)
        key = (model, path, stat.st_mtime_ns, stat.st_size)
    except OSError:
        key = None
    if key in _LOADED:
        return _LOADED[key]
    try:
        with open(path, "rb") as f:
            cfg = json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {exc.lineno}: not JSON ({exc.msg})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: not a Hugging Face config (a JSON object), but a {type(cfg).__name__}")
    spec = spec_from_hf_config(cfg, model, path)
    if key is not None:
        _LOADED[key] = spec
    return spec


def _count(cfg: dict, key: str, path: str, minimum: int = 1):
    """`cfg[key]` as an int >= `minimum`, or None when absent or null: a model
    shape is a whole number (JSON's 64.0 counts, NaN, a string or a bool does
    not), and no head count or width is zero or negative, as transformers'
    configs require before vLLM divides by them."""
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
            or value in (float("inf"), float("-inf")) or value != int(value):
        raise InputError(f"{path}: {key}: must be a whole number, not {json.dumps(value)}")
    if value < minimum:
        raise InputError(f"{path}: {key}: must be at least {minimum}, not {json.dumps(value)}")
    return int(value)


def spec_from_hf_config(cfg: dict, name: str, path: str = "config.json") -> ModelSpec:
    """The shapes of a Hugging Face config (text part of a multimodal one).
    Every shape read is checked by `_count`: a malformed config.json is an
    InputError naming the file and the key, never a nonsense capacity."""
    has_vision = isinstance(cfg.get("vision_config"), dict)
    if isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg:
        cfg = {**cfg, **cfg["text_config"]}
    missing = [k for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
               if cfg.get(k) is None]
    if missing:
        raise InputError(f"{path}: not a decoder config servesim can read (missing {', '.join(missing)})")

    def count(*keys, minimum=0):
        """The first of `keys` given (None or 0 falls through, as `or` did), else 0."""
        for key in keys:
            value = _count(cfg, key, path, minimum)
            if value:
                return value
        return 0

    hidden = _count(cfg, "hidden_size", path)
    heads = _count(cfg, "num_attention_heads", path)
    layers = _count(cfg, "num_hidden_layers", path)
    vocab = _count(cfg, "vocab_size", path)
    experts = count("num_experts", "num_local_experts", "n_routed_experts")
    shared = count("n_shared_experts") * count("moe_intermediate_size")
    shared = shared or count("shared_expert_intermediate_size")
    window = count("sliding_window") if cfg.get("use_sliding_window", True) else 0
    if isinstance(cfg.get("layer_types"), list) and cfg["layer_types"] \
            and "sliding_attention" not in cfg["layer_types"]:
        window = 0
    quant = cfg.get("quantization_config")
    quant = quant.get("quant_method") if isinstance(quant, dict) else None
    kv_heads = count("num_key_value_heads") or heads
    if kv_heads > heads:
        raise InputError(f"{path}: num_key_value_heads: {kv_heads} is more than num_attention_heads {heads}")
    head_dim = count("head_dim") or hidden // heads
    if not head_dim:
        raise InputError(f"{path}: hidden_size {hidden} over num_attention_heads {heads} leaves no "
                         "head_dim; give head_dim")
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=count("intermediate_size"),
        vocab_size=vocab,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts=experts,
        experts_per_token=count("num_experts_per_tok", "experts_per_token"),
        moe_intermediate_size=count("moe_intermediate_size", "intermediate_size"),
        shared_expert_intermediate_size=shared,
        dense_layers=count("first_k_dense_replace") if experts else 0,
        kv_lora_rank=count("kv_lora_rank"),
        qk_rope_head_dim=count("qk_rope_head_dim"),
        sliding_window=window,
        config_quantization=quant,
        derived_max_model_len=derived_max_model_len(cfg, path),
        sglang_context_length=sglang_context_length(cfg, path),
        has_vision=has_vision,
        mtp_layers=count("num_nextn_predict_layers", "mtp_num_hidden_layers"),
    )


# the config.json keys vLLM reads a context length from (the smallest wins)
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_target_positions", "max_sequence_length",
                "max_seq_length", "seq_len")


def derived_max_model_len(cfg: dict, path: str = "config.json") -> int:
    """vLLM's `_get_and_verify_max_len` (vllm/config/model.py) before the
    user's value: the smallest of the length keys, `model_max_length` if the
    config has one, times the RoPE scaling factor unless the rope type
    (`su`, `longrope`, `llama3`) or a Gemma 3 model already counts it, a
    `yarn` rope scaling its `original_max_position_embeddings`. A config
    with none of the keys gets 131072 here (vLLM assumes 2048 with a
    warning; no Hugging Face config of a served model lacks them). Every
    length read is checked by `_count` (an InputError naming the file and key)."""
    lengths = {k: _count(cfg, k, path) for k in _LENGTH_KEYS}
    lengths = {k: v for k, v in lengths.items() if v is not None}
    if not lengths:
        return 131072
    length = lengths.get("model_max_length") or min(lengths.values())
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if isinstance(rope, dict) and "rope_type" not in rope and "type" not in rope:  # per layer type
        rope = next(iter(rope.values()), None)
    if isinstance(rope, dict) and "gemma3" not in str(cfg.get("model_type", "")):
        kind = rope.get("rope_type") or rope.get("type")
        if kind not in ("su", "longrope", "llama3"):
            where = f"{path}: rope_scaling"
            if kind == "yarn":
                length = _count(rope, "original_max_position_embeddings", where) or length
            factor = rope.get("factor", 1.0)
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
                    or not 0 < factor < float("inf"):
                raise InputError(f"{where}: factor: must be a positive number, not {json.dumps(factor)}")
            length *= factor
    return int(length)


# the config.json keys SGLang reads a context length from, in its order of
# preference (CONTEXT_LENGTH_KEYS, sglang/srt/utils/hf_transformers/common.py)
_SGLANG_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")


def sglang_context_length(cfg: dict, path: str = "config.json") -> int:
    """SGLang 0.5.23's `get_context_length` (sglang/srt/utils/hf_transformers/
    common.py), the default of `context_length`: the first of its length keys
    the config has (not the smallest, as vLLM takes), times the RoPE scaling
    factor unless the scaling names `original_max_position_embeddings` or is
    `llama3`; 2048 when the config has none of the keys."""
    rope = cfg.get("rope_scaling")
    factor = 1
    if isinstance(rope, dict) and rope:
        factor = rope.get("factor", 1)
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
                or not 0 < factor < float("inf"):
            raise InputError(f"{path}: rope_scaling: factor: must be a positive number, "
                             f"not {json.dumps(factor)}")
    for key in _SGLANG_LENGTH_KEYS:
        value = _count(cfg, key, path)
        if value is not None:
            return int(factor * value)
    return 2048
