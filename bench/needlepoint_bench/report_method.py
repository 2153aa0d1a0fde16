"""Fixed prose of the benchmark report: the method section and the needle-rs API facts the
bench relies on (inserted verbatim into `docs/benchmarks.md`)."""

METHOD = """\
## Method

**What is compared.** One archive, the same token ids, the same number of new tokens, greedy
decoding, in one run of `needlepoint-bench`. needle-rs builds its prompt itself from
`(query, tools_json, system)` (upstream wire format, `[BOS] + encode(prompt)`); the bench
renders the same string, tokenizes it with the archive's tokenizer and hands those ids to
needlepoint. Every needle-rs call reports its prompt length (`positions - len(token_ids)`),
which is checked against the ids needlepoint got (section *Checks*); where needlepoint's
float numerics run, their first greedy token is compared with needle-rs's as well (needle-rs
reproduces the fixture's float greedy tokens exactly).

**Workloads.** Prefill = prompt → logits of the last position → argmax: for needle-rs one
`generate(..., max_new_tokens=1)` call (render + tokenize + prefill + argmax, its only entry
point); for needlepoint `model.session()` + `session.prefill(ids)` + argmax (tokenization is
done beforehand and excluded; its cost for the longest prompt is listed below). Decode = n
greedy steps after the tool prompt: needlepoint times n × (`step(argmax)`) after a prefill;
needle-rs has no step API, so decode time is `generate(max_new_tokens=n+1)` minus
`generate(max_new_tokens=1)` measured back to back on the same prompt (its per-call fixed
cost and the prefill cancel). Fixed-length prompts use `tools_json = "[]"` and an English
query padded to the exact count (the shortest prompt needle-rs can express is 13 tokens);
the tool prompt is two tools plus a natural query.

**EOS.** needle-rs stops at EOS or `<|im_end|>` (`stop_reason` `Eos` / `ImEnd`) and has no
option to disable that; needlepoint's loop never stops. The bench records needle-rs's
`stop_reason` and actual token count, and all rates are per token actually produced. On
this random-weight archive the greedy continuations of the bench prompts have not hit one
(*Checks* lists this run's stop reasons and token counts).

**Repetitions and interleaving.** One timing process per thread count loads all engines
side by side, warms each up once, then repeats every workload `reps` times; within a
repetition each workload is run by every engine back to back, in an order rotated each
repetition, so drift in machine load hits all engines alike. Figures are medians with
[min–max] over repetitions; ratios are ratios of medians, and the *paired range* is the
min–max of per-repetition ratios (possible because the samples are interleaved). Rates
are computed per sample, then the median is taken.

**Threads.** Each child process starts with `OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS`,
`MKL_NUM_THREADS` and `RAYON_NUM_THREADS` set to the thread count and
`OMP_WAIT_POLICY=passive`; threadpoolctl pins the BLAS pools again inside the process
(`threadpool_limits(n)`). needle-rs is *not* single-threaded: it links rayon and uses the
global rayon pool (default = all cores), which `RAYON_NUM_THREADS` controls; the variable is
read when the pool starts, so the thread count is fixed per process. That is why each thread
count is its own timing process. At 2 threads only the headline workloads and engines run.

**Load time and peak RSS need fresh processes.** Load (archive → first-token-ready) is
measured in a new process per sample (engines alternating): `load()` wall time plus the
first call's excess over a second identical call (lazy initialisation), on the shortest
prompt. The page cache is warm after the first sample, so the archive is read from memory.
needlepoint prepares float32 weights from the archive; it can keep them in a cache file
(`needlepoint.weight_cache`, mapped read-only on later loads), so it is measured twice per
sample, in a fresh temp cache folder: *cold* (no cache file: weights built, the file
written by a background thread that overlaps the first call) and *warm* (the file the cold
process wrote is present). The benchmark never uses ~/.cache; timing processes run with
the cache off. Peak RSS
is a per-process high-water mark (`getrusage(RUSAGE_SELF).ru_maxrss`), so each engine runs
its RSS workload (longest prompt + the decode length) alone in its own process; every such
process imports numpy, needle_rs and needlepoint before loading, so the baselines are equal,
and the table shows the baseline too. Memory-mapped archive pages that are touched count
toward RSS for both engines.

**Machine floor.** In each timing process, before and after the engines run: `sum` over a
512 MiB float64 buffer (DRAM read bandwidth; split over the thread count), `copyto`
(read + write) and `sum` over a 16 MiB buffer repeated (last-level-cache read bandwidth).
The decode floor is the bytes a decode step must stream — every CQ matrix except the engram
tables (gathered: a few rows per token), with the embedding counted in full because it is
the tied LM head; confidence head excluded — divided by the best measured DRAM read
bandwidth. Packed decode weights that fit in the last-level cache (compare the machine line
above) could be served from it, so a cache floor is given as well. The floor bounds an
engine that streams the packed weights once per token; an engine that keeps dequantized
copies reads more (last column of that table).

**Weight bytes per decode token.** needle-rs runs from the packed archive (load takes
~0.05 s and its peak RSS is about the archive size, so it does not keep dequantized copies):
its figure is the archive's packed decode bytes plus the small FP16/FP32 parameters. For
needlepoint the model's own `decode_weight_bytes` is used if it declares one; otherwise the
bench sums the numpy arrays reachable from the model object (by data pointer), minus those on
a path containing `table`, `confidence` or `tokenizer` — an estimate, listed with its largest
arrays in the JSON.

**Noise.** The reference machine has 2 cores shared with other jobs; medians and the
[min–max] spread are the honest summary, and the 2-thread figures are the noisiest.
"""

RS_API = """\
## needle-rs facts this bench relies on (0.3.1)

* `needle_rs.V3Engine.load(cact_path)`, `.from_bytes(cact_bytes)`,
  `.load_with_depth(path, layers)` (ladder rung); properties `num_layers`, `max_seq_len`.
* `generate(query, tools_json, max_new_tokens=0, temperature=0.0, seed=0, system=None,
  constrain=False, kv_int8=False)` → dict `text`, `tool_call`, `reasoning`, `token_ids`,
  `stop_reason` (`MaxTokens`, `Eos`, `ImEnd`, `ContextFull`, `MaxSeqLen`), `positions`
  (prompt + generated). `max_new_tokens=0` means the default of 256. The prompt length is
  `positions - len(token_ids)`. `tools_json` is inserted verbatim (not parsed).
* `run(query, tools_json)`, `run_json`, `run_scored`, `run_stream(query, tools_json,
  callback(piece))` use default settings (no token limit control); `confidence_for(query,
  tools_json, completion)`, `has_confidence()`, `kv_bytes(seq_len, kv_int8=False)`.
* No raw-token-id input, no logits, no per-step API; no EOS override (stops at EOS and
  `<|im_end|>`); no thread option in the API — threads come from rayon's global pool
  (`RAYON_NUM_THREADS`). Numerics are float32 (`kv_int8=True` quantises q/k/v per head
  only); it does not implement the archive's A8 deploy numerics.
"""
