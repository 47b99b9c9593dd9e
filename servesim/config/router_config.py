"""Reading and checking `cluster.router` (the schema of
:class:`~servesim.config.config_types.RouterConfig`): a policy name, or a
mapping of `policy` and that policy's knobs (README.md, "Routing")."""

import attrs

from servesim.config.config_types import RouterConfig, router_config
from servesim.config.validation import INT, NUMBER, Section, check, enum, ge

POLICIES = ("round_robin", "least_loaded", "least_prefill", "kv_router", "kv_aware",
            "weighted", "session_affinity")  # kv_aware: read as kv_router (`router_config`)
KNOBS = {"kv_router": ("overlap_score_weight", "router_temperature", "seed", "kv_event_lag_ms"),
         "weighted": ("scorers", "seed")}
SCORERS = ("prefix_cache", "queue_depth", "kv_usage")
KEYS = ("policy", *dict.fromkeys(k for knobs in KNOBS.values() for k in knobs))


def parse_router(ctx, data, path="cluster.router") -> RouterConfig:
    """The validated :class:`RouterConfig` at `path` (the default when
    absent). A knob of another policy, a negative weight or temperature, an
    unknown scorer, or a KV event lag (not modelled: the router sees each
    prefix cache as it is) is an error naming its key."""
    if data is None:
        return RouterConfig()
    if isinstance(data, str) or not isinstance(data, dict):
        return router_config(check(ctx, path, data, enum(*POLICIES)))
    s = Section(ctx, data, path, KEYS)
    policy = router_config(s.get("policy", enum(*POLICIES))).policy
    for key in s.data:
        if key != "policy" and key not in KNOBS.get(policy, ()):
            owners = " or ".join(p for p, knobs in KNOBS.items() if key in knobs)
            ctx.fail(s.sub(key), f"is a knob of policy {owners}, not of {policy!r}")
    d = {f.name: f.default for f in attrs.fields(RouterConfig)}
    seed = s.get("seed", INT, d["seed"], ge(0))
    if policy == "weighted":
        return RouterConfig(policy=policy, seed=seed, **_scorers(ctx, s))
    if policy != "kv_router":
        return RouterConfig(policy=policy)
    lag = s.get("kv_event_lag_ms", NUMBER, d["kv_event_lag_ms"], ge(0))
    return RouterConfig(
        policy=policy,
        overlap_score_weight=s.get("overlap_score_weight", NUMBER, d["overlap_score_weight"],
                                   ge(0)),
        router_temperature=s.get("router_temperature", NUMBER, d["router_temperature"], ge(0)),
        seed=seed,
        kv_event_lag_ms=lag,
    )


def _scorers(ctx, s: Section) -> dict:
    """`weighted`'s `scorers`: each scorer's weight (a number >= 0; a scorer
    not named keeps weight 1, the gateways' default; all 0 is an error)."""
    scorers = Section(ctx, s.data.get("scorers"), s.sub("scorers"), SCORERS)
    weights = {name: scorers.get(name, NUMBER, 1.0, ge(0)) for name in SCORERS}
    if not any(weights.values()):
        ctx.fail(s.sub("scorers"), "gives every scorer weight 0: no rank could score above "
                 "another")
    return weights


def to_data(router: RouterConfig):
    """The YAML layout of `cluster.router`: the policy's name when its knobs
    are the defaults (as a config without them reads), else the mapping."""
    if router == RouterConfig(policy=router.policy):
        return router.policy
    knobs = {key: ({name: getattr(router, name) for name in SCORERS} if key == "scorers"
                   else getattr(router, key)) for key in KNOBS[router.policy]}
    return {"policy": router.policy, **knobs}
