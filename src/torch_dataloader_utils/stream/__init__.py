"""In each worker: one stream, from the pass it reads to batches, a stage per module.

- `read`: pieces of chunks → Arrow record batches (partition columns, row filter, checks);
- `blocks`: block sizes and the block shuffle (where rows are shuffled);
- `batches`: blocks cut into ``batch_size`` batches;
- `prefetch`: the read-ahead thread;
- `mix`: a mixture's batches, each source's rows placed at its positions;
- `pipeline`: the stages put together, for one stream (`stream_segments`).

Which rows a stream reads is decided in `planning.streams`.
"""
