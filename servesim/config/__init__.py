"""The config: its schema and types (`config`, `config_types`,
`deployment_config`, `speculative_config`, `slo`), YAML reading and `--set`
overrides (`yaml_input`), the checks and their messages (`validation`,
`fitted_checks`, `preflight`) and the ready examples (`examples`).

It builds the engine's, scheduler's and KV cache's config objects, so it sits
above them; the workload, the replay and everything above read it.
"""
