"""A deployment nobody has measured yet: model + GPU + parallelism turned into
the two things the engine needs, its KV capacity (`capacity`) and its pass
times (`aic_tables`, priced by the `table` model of `servesim.engine.pricing`).

`specs` reads model and GPU specs; `aic` is the only module that imports the
optional `aiconfigurator-core` package, lazily. docs/deployment.md describes
the whole path and its caveats.
"""
