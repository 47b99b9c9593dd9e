"""What a replay serves: traces (`workload`), synthetic workloads
(`synthetic`), sessions and agent graphs (`sessions`, `session_trace`) and the
prefix block identities the KV cache matches on (`prefix`)."""
