"""Model names as users and measurements write them (docs/deployment.md,
"Model names"): the one table mapping Hugging Face names and the names of
aiconfigurator-core's silicon measurements to the database's model names,
and the nearest names for an unknown one.
"""

import difflib

# name as written -> the database's name for the same checkpoint architecture
MODEL_ALIASES = {
    # Meta renamed its Llama 3.1 repositories from Meta-Llama-3.1-* to Llama-3.1-*;
    # the database keeps the old names (its silicon rows use the new ones).
    # Instruct checkpoints have the base model's shapes.
    **{f"meta-llama/{name}{suffix}": f"meta-llama/Meta-Llama-3.1-{size}"
       for size in ("8B", "70B", "405B")
       for name in (f"Llama-3.1-{size}", f"Meta-Llama-3.1-{size}")
       for suffix in ("", "-Instruct")
       if f"{name}{suffix}" != f"Meta-Llama-3.1-{size}"},
    # Zhipu AI publishes GLM under zai-org (the silicon rows write zhipuai/)
    "zhipuai/GLM-5": "zai-org/GLM-5",
}


def resolve_model_name(name: str) -> str:
    """The database's name for `name` (itself when it has no alias)."""
    return MODEL_ALIASES.get(name, name)


def nearest_names(name: str, known) -> list:
    """Up to three known names (database names and aliases) nearest `name`."""
    lowered = {k.lower(): k for k in known}
    found = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.5)
    return [lowered[k] for k in found]
