"""The offline mode: `vllm bench throughput` / `latency` run to their end inside a configuration's placement
group, without a server. The client's offline backend is the bench's (`bench.offline`).

A mode: may import every stage and the stage-free rooms, never another mode.
"""
