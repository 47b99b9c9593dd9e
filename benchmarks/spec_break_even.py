"""Break-even acceptance of speculative decoding on a named deployment
(issue 40): the mean accepted drafts per verification pass at which a decode
pass of B requests with k drafts each, drafter included, yields tokens as fast
as the plain pass, `T_spec / T_plain - 1`, priced by servesim's `aic` tables
(servesim/deployment/table_pricing.py table_spec_pass_ms) against
aiconfigurator-core's static MTP estimate (`decode_step_latency` of the model
compiled with `nextn = k` over the one with `nextn = 0`, the same batch and
sequence lengths). Needs the aic extra:

    python benchmarks/spec_break_even.py [MODEL GPU TP]   (default Qwen/Qwen3-32B h100_sxm 1)
"""

import sys


def main(argv):
    import logging

    from servesim.config.config import config_from_dict
    from servesim.deployment import aic
    from servesim.deployment.aic_tables import pricing_table
    from servesim.engine.pricing import TABLE, price_pass

    model, gpu, tp = (argv + ["Qwen/Qwen3-32B", "h100_sxm", "1"][len(argv):])[:3]
    isl, osl, k = 1024, 1024, 3
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    from aiconfigurator_core.sdk.engine import EngineHandle

    version = aic.backend_version(gpu)
    handles = {n: EngineHandle.compile(model, gpu, "vllm", backend_version=version, tp_size=int(tp),
                                       nextn=n) for n in (0, k)}

    def table(speculative=None, **extra):
        engine = {"model": model, "gpu": gpu, "tensor_parallel_size": int(tp), "max_num_seqs": 128,
                  "max_num_batched_tokens": 8192, "max_model_len": 8192, "timing": {"type": "aic"},
                  **extra}
        if speculative:
            engine["speculative"] = {"method": speculative, "num_speculative_tokens": k}
        cfg = config_from_dict({"workload": {"synthetic": {"requests": 1, "input_tokens": isl,
                                                           "output_tokens": osl}}, "engine": engine})
        return pricing_table(cfg.engine)

    # MTP and EAGLE are priced alike (one decoder layer + the LM head a draft
    # step); Qwen3-32B has no MTP layers, so EAGLE stands for both here
    plain, eagle, ngram = table(), table("eagle"), table("ngram", async_scheduling=False)
    s = isl + osl // 2 + 1  # aiconfigurator's decode step's sequence length
    print(f"{model} on {gpu} TP {tp}, k = {k}, {s} tokens of context a request")
    print("break-even accepted drafts a verification pass (T_spec / T_plain - 1)")
    print("batch  aic-static-mtp  servesim-eagle/mtp  servesim-ngram")
    for b in (1, 8, 16, 32, 64, 80, 128):
        static = (handles[k].decode_step_latency(b, isl, osl)
                  / handles[0].decode_step_latency(b, isl, osl) - 1)
        t0 = price_pass(TABLE, plain, 0, 0, b, b * s, b, b, 1.0)
        row = [price_pass(TABLE, t, 0, 0, b, b * s, b * (k + 1), b, 1.0, b * k, 0, 0) / t0 - 1
               for t in (eagle, ngram)]
        print(f"{b:5d}  {static:14.2f}  {row[0]:18.2f}  {row[1]:14.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
