"""The simulated SGLang engine (docs/sglang.md): SGLang 0.5.23's scheduler,
radix cache and retraction, in plain Python. `engine.backend: sglang`."""
