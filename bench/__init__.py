"""`ablate bench`: how fast the harness trains, decodes and sweeps, each figure measured side by side with
its reference in one run, so that the ratios hold on a noisy, shared machine.

Figures (keys of the JSON object; each has a value, a unit, a target and a status):
  a_transformer_step   our Transformer's training tokens/s over torch.nn.Transformer's, same sizes and batch
  b_harness_overhead   Seq2SeqModule through the Lightning Trainer over a plain PyTorch loop, time ratio
  c_lstm_parallel      Luong attention without input feeding: parallel teacher forcing over the step loop
  d_greedy, d_beam     decoding throughput in sentences/s
  e_padding            padding share of token-budget length buckets (against random fixed-size batches)
  f_sweep_scaling      finished trials per hour with K = 1, 2, 4 concurrent worker processes per device
  g_mfu                bf16 model FLOP utilisation of a d_model = 1024, 6 + 6-layer Transformer (CUDA only)
  h_fused_seeds        K seeds of the quickstart's Transformer fused into one model over the same K trained one by
                       one, seed-steps/s (K = 4 on a CPU, 16 on a GPU)
  i_fused_trials       the same K seeds as whole trials through the harness, one fused group over K trials alone
  j_compile_<size>     a training step compiled whole (train.compile) against the same step eager, at the
                       quickstart's size and a GPU profile's, time ratio (and the compile time)
  k_trial_vs_captured  a trial's step at the quickstart's size over the same step captured as one CUDA graph
                       (CUDA only)

Timing: warm-up calls, then the median of several repeats, with the compared runs interleaved (ABAB...)
so that load from other processes falls on both sides alike.

One job per file; each imports only from those above it:
  timing.py     a Figure and how one is judged; interleaved timing, CUDA synchronisation, bf16 autocast
  workload.py   what is timed: the run's sizes, synthetic batches, training steps, the compared configs
  training.py   figures a, b, c, e and g: training speed against references, harness overhead, padding, MFU
  decoding.py   figures d: greedy and beam search throughput
  sweep.py      figure f: sweeps with K worker processes
  fused.py      figures h and i: fused seeds against the same seeds trained apart (a step; whole trials)
  compile.py    figures j and k: compiled and captured steps against eager ones
  run.py        every figure in order, the machine they ran on, the device, the table (`ablate bench`)
"""
