"""Loads remax-bench's OpenRLHF CPU layer in every Python process of .venvs/openrlhf-cpu where a CPU plan asks for it
(REMAX_BENCH_OPENRLHF_CPU=1); OpenRLHF has no plugin entry point, and Ray and vLLM start their own processes."""

import os

if os.environ.get("REMAX_BENCH_OPENRLHF_CPU") == "1":
    import remax_bench_openrlhf_cpu

    remax_bench_openrlhf_cpu.install()
