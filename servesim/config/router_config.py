"""Reading and checking `cluster.router` (the schema of
:class:`~servesim.config.config_types.RouterConfig`): a policy name, or a
mapping of `policy` and that policy's knobs (README.md, "Routing")."""

import attrs

from servesim.config.config_types import RouterConfig, router_config
from servesim.config.validation import INT, NUMBER, Section, check, enum, ge, show

POLICIES = ("round_robin", "least_loaded", "least_prefill", "kv_router", "kv_aware",
            "session_affinity")  # kv_aware: read as kv_router (`router_config`)
KV_ROUTER_KEYS = ("overlap_score_weight", "router_temperature", "seed", "kv_event_lag_ms")
KEYS = ("policy", *KV_ROUTER_KEYS)


def parse_router(ctx, data, path="cluster.router") -> RouterConfig:
    """The validated :class:`RouterConfig` at `path` (the default when
    absent). A knob of `kv_router` given with another policy, a negative
    weight or temperature, or a KV event lag (not modelled: the router sees
    each prefix cache as it is) is an error naming its key."""
    if data is None:
        return RouterConfig()
    if isinstance(data, str) or not isinstance(data, dict):
        return router_config(check(ctx, path, data, enum(*POLICIES)))
    s = Section(ctx, data, path, KEYS)
    policy = router_config(s.get("policy", enum(*POLICIES))).policy
    if policy != "kv_router":
        for key in KV_ROUTER_KEYS:
            if key in s.data:
                ctx.fail(s.sub(key), f"is a knob of policy kv_router, not of {policy!r}")
        return RouterConfig(policy=policy)
    d = {f.name: f.default for f in attrs.fields(RouterConfig)}
    lag = s.get("kv_event_lag_ms", NUMBER, d["kv_event_lag_ms"], ge(0))
    if lag:
        ctx.fail(s.sub("kv_event_lag_ms"), f"must be 0, got {show(data['kv_event_lag_ms'])}: "
                 "KV event lag is not modelled (the router sees each rank's prefix cache as "
                 "it is at the arrival, as Dynamo's replay does by default)")
    return RouterConfig(
        policy=policy,
        overlap_score_weight=s.get("overlap_score_weight", NUMBER, d["overlap_score_weight"],
                                   ge(0)),
        router_temperature=s.get("router_temperature", NUMBER, d["router_temperature"], ge(0)),
        seed=s.get("seed", INT, d["seed"], ge(0)),
        kv_event_lag_ms=lag,
    )


def to_data(router: RouterConfig):
    """The YAML layout of `cluster.router`: the policy's name when its knobs
    are the defaults (as a config without them reads), else the mapping."""
    if router == RouterConfig(policy=router.policy):
        return router.policy
    return {"policy": router.policy,
            **{key: getattr(router, key) for key in KV_ROUTER_KEYS}}
