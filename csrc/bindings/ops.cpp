// The one schema registry of torch.ops.ssd. Implementations are registered per
// dispatch key next to their glue code: bindings/<op>_cpu.cpp (CPU and Meta)
// and bindings/<op>_cuda.cpp (CUDA, built with SSD_WITH_CUDA).
//
// Shapes (T tokens, N branches/rows, S sequences, B sequences in a round,
// K draft tokens, V vocab, Hq/Hkv heads, D head dim, L layers):
//   paged_attention  q [T,Hq,D] f32; k_cache, v_cache [blocks,block_size,Hkv,D] f32;
//                    block_tables [S,max_blocks] i32; seq_of_token, positions [T] i32;
//                    out [T,Hq,D]; window >= 0. Query t attends to keys 0..positions[t] of its
//                    sequence, or with window > 0 to keys positions[t]-window+1..positions[t].
//   fork_attention   paged_attention's arguments, and prefix_seq, prefix_len [T] i32
//                    (0 <= prefix_len[t] <= positions[t]): query t (a tree branch)
//                    reads its keys below prefix_len[t] through row prefix_seq[t] of
//                    block_tables (the sequence it forks from), the others through
//                    its own row seq_of_token[t]; bitwise paged_attention's result
//                    over a table holding those slots.
//   saguaro_sample   logits [N,V] f32; temperature, top_p, downweight, uniforms [N] f64;
//                    top_k, fanout [N] i64; probs out [N,V] f32 -> tokens [N] i64.
//                    probs = sigma_{F,C} of the processed distribution.
//   gumbel_sample    probs [N,V] f32 (finite, >= 0); seeds [N] i64 (a u64's bits);
//                    positions [N] i64 (>= 0) -> tokens [N] i64: the Gumbel-max draw
//                    argmax_{p_t > 0} p_t / E_t, E_t ~ Exp(1) keyed by (seed, position, t);
//                    ties to the lowest id, a row without support gives 0.
//   gumbel_top       probs, seeds, positions as gumbel_sample; 0 <= depth <= 512
//                    -> ids [N,depth] i64 (-1 past the row's support), scores [N,depth] f64:
//                    the depth best tokens by p_t / E_t (desc; ties to the lowest id).
//   fork_select      probs [B,K+1,V] f32; drafted [B,K] i64; fanout [K+1] i64;
//                    max_fanout >= max(fanout) -> candidates [B,K+1,max_fanout] i64
//                    (-1 padded), counts [B,K+1] i64.
//   verify           target_logits [B,K+1,V] f32; proposals [B,K] i64;
//                    num_proposals [B] i64 (<= K); q_probs [B,K,V] f32 (ignored where
//                    one_hot); one_hot [B] bool; temperature, top_p [B] f64; top_k [B] i64;
//                    accept_uniforms [B,K] f64; bonus_uniforms [B] f64
//                    -> accepted [B] i64, bonus [B] i64.
//   kv_commit        cache [L,2,slots,Hkv,D] f32 (mutated); tree [L,2,tree_slots,Hkv,D];
//                    src_slots, dst_slots [n] i64: cache[:, :, dst[i]] = tree[:, :, src[i]].
//   kv_truncate      block_tables [S,max_blocks] i32 (-1 = none), seq_lens [S] i32,
//                    block_refcount [blocks] i32 (all mutated); seq_ids, new_lens [n] i64:
//                    shortens each listed sequence and releases blocks past its new end.
#include <torch/library.h>

TORCH_LIBRARY(ssd, m) {
  // k_cache / v_cache: float32, or both bfloat16 (read widened to fp32).
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_of_token, Tensor positions, float scale, Tensor(a!) out, int window=0) -> ()");
  m.def(
      "fork_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_of_token, Tensor positions, Tensor prefix_seq, Tensor prefix_len, float scale, "
      "Tensor(a!) out, int window=0) -> ()");
  m.def(
      "saguaro_sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, "
      "Tensor fanout, Tensor downweight, Tensor uniforms, Tensor(a!) probs) -> Tensor");
  m.def("gumbel_sample(Tensor probs, Tensor seeds, Tensor positions) -> Tensor");
  m.def("gumbel_top(Tensor probs, Tensor seeds, Tensor positions, int depth) -> (Tensor, Tensor)");
  m.def("fork_select(Tensor probs, Tensor drafted, Tensor fanout, int max_fanout) -> (Tensor, Tensor)");
  m.def(
      "verify(Tensor target_logits, Tensor proposals, Tensor num_proposals, Tensor q_probs, "
      "Tensor one_hot, Tensor temperature, Tensor top_k, Tensor top_p, Tensor accept_uniforms, "
      "Tensor bonus_uniforms) -> (Tensor, Tensor)");
  m.def("kv_commit(Tensor(a!) cache, Tensor tree, Tensor src_slots, Tensor dst_slots) -> ()");
  m.def(
      "kv_truncate(Tensor(a!) block_tables, Tensor(b!) seq_lens, Tensor(c!) block_refcount, "
      "Tensor seq_ids, Tensor new_lens, int block_size) -> ()");
}
