"""In each worker: one stream, from the pass it reads to batches, a stage per module.

- `resolve`: which rows this worker's stream reads in a pass, and where it starts;
- `read`: pieces of chunks → Arrow record batches (partition columns, row filter, checks);
- `blocks`: block sizes and the block shuffle (where rows are shuffled);
- `batches`: blocks cut into ``batch_size`` batches;
- `prefetch`: the read-ahead thread;
- `pipeline`: the stages put together, for one stream (`stream_segments`).
"""
