// CudaBackend against CpuBackend, op by op, on random bf16 inputs of the tiny config's sizes (H 256, 8 heads
// of 128, q_lora 128, 4 groups of 128, V 1024, B 3 requests of k 5 rows): memory, dense ops, RoPE, kv QDQ and
// conversions. Tolerances: cuda_op_harness.hpp. Every GPU op also runs twice and must repeat its bits.
#include <cstring>
#include <random>

#include "lib/core/error.hpp"
#include "tests/gpu/cuda_op_harness.hpp"
#include "tests/support/tensor_host.hpp"

namespace dspark {
namespace {

using test::fetch;
using test::normal_bf16;
using test::Outs;
using test::put;
using test::put_i32;

LinearWeight dense(Backend& be, const std::string& name, int64_t out, int64_t in,
                   const std::vector<float>& w) {
  return dense_linear(name, put(be, DType::bf16, {out, in}, w));
}

using CudaOps = test::CudaOps;

TEST_F(CudaOps, MemoryRoundTripFillZeroAndRowViews) {
  std::mt19937 g(1);
  const std::vector<float> v = normal_bf16(g, 6 * 40, 1.0f);
  auto [cpu, gpu] = run([&](Backend& be) {
    Tensor a = put(be, DType::bf16, {6, 40}, v);
    Tensor f = be.alloc(DType::f32, {6, 40});
    be.zero(f);
    Tensor i = be.alloc(DType::i32, {7, 3});
    be.fill_i32(i, -1);
    be.fill_i32(i.rows(2, 3), 42);  // a view: only rows 2..4
    be.upload(a.rows(4, 1), std::vector<uint16_t>(40, float_to_bf16(3.5f)).data());
    return Outs{fetch(be, "bf16", a), fetch(be, "zero", f), fetch(be, "fill", i),
                fetch(be, "view", a.rows(3, 2))};
  });
  for (size_t n = 0; n < cpu.size(); ++n) test::expect_same_bits(cpu[n], gpu[n]);
}

TEST_F(CudaOps, UploadsCarryTheCallersBytesAfterItReusesTheBufferAndLargeTransfersRoundTrip) {
  // Uploads return before they land (through pinned staging): the caller's buffer is reused and freed at
  // once, and each tensor must still get the bytes it held at its call.
  const int64_t n = 1000;
  Tensor a = gpu_->alloc(DType::i32, {n}), b = gpu_->alloc(DType::i32, {n});
  {
    std::vector<int32_t> host(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<int32_t>(3 * i + 1);
    gpu_->upload(a, host.data());
    for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<int32_t>(-7 * i);
    gpu_->upload(b, host.data());
  }
  std::vector<int32_t> got_a(static_cast<size_t>(n)), got_b(static_cast<size_t>(n));
  gpu_->download(got_a.data(), a);
  gpu_->download(got_b.data(), b);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got_a[static_cast<size_t>(i)], 3 * i + 1) << i;
    ASSERT_EQ(got_b[static_cast<size_t>(i)], -7 * i) << i;
  }
  // 65 MiB: more than the pinned staging holds (64 KiB), so straight from / to the caller's memory.
  const int64_t big = (int64_t{65} << 20);
  std::vector<uint8_t> pattern(static_cast<size_t>(big)), back(static_cast<size_t>(big));
  for (int64_t i = 0; i < big; ++i) pattern[static_cast<size_t>(i)] = static_cast<uint8_t>((i * 7) % 251);
  Tensor t = gpu_->alloc(DType::u8, {big});
  gpu_->upload(t, pattern.data());
  gpu_->download(back.data(), t);
  EXPECT_TRUE(back == pattern);
  // A host transfer cannot be recorded: it is refused with the reason, and the stream stays usable.
  gpu_->begin_capture();
  EXPECT_THROW(gpu_->upload(a, got_b.data()), Error);
  (void)gpu_->end_capture();
  gpu_->download(got_a.data(), a);
  EXPECT_EQ(got_a[1], 4);
}

TEST_F(CudaOps, CopyMovesHostMemoryInsideTheStreamAndInsideARecording) {
  // Mapped host memory read and written by the copy kernel: in 32-bit words (an i32 buffer) and in bytes (an
  // odd length), eagerly and replayed from a recording that reads what the host wrote after it was made.
  const int64_t n = 301;
  Tensor host_in = gpu_->alloc_host(DType::i32, {n}), host_out = gpu_->alloc_host(DType::i32, {n});
  Tensor dev = gpu_->alloc(DType::i32, {n});
  for (int64_t i = 0; i < n; ++i) host_in.as<int32_t>()[i] = static_cast<int32_t>(1000003 * i) ^ 0x5a5a5a5a;
  gpu_->copy(host_in, dev);
  gpu_->copy(dev, host_out);
  gpu_->synchronize();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(host_out.as<int32_t>()[i], host_in.as<int32_t>()[i]) << i;

  gpu_->begin_capture();
  gpu_->copy(host_in, dev);
  gpu_->fill_i32(dev.rows(0, 1), -9);
  gpu_->copy(dev, host_out);
  const std::shared_ptr<void> graph = gpu_->end_capture();
  ASSERT_TRUE(graph);
  for (int round = 0; round < 3; ++round) {
    for (int64_t i = 0; i < n; ++i) host_in.as<int32_t>()[i] = static_cast<int32_t>(i * (round + 2));
    gpu_->replay(graph);
    gpu_->synchronize();
    EXPECT_EQ(host_out.as<int32_t>()[0], -9);
    for (int64_t i = 1; i < n; ++i)
      ASSERT_EQ(host_out.as<int32_t>()[i], i * (round + 2)) << round << " " << i;
  }

  Tensor bytes_in = gpu_->alloc_host(DType::u8, {13}), bytes_dev = gpu_->alloc(DType::u8, {13}),
         bytes_out = gpu_->alloc_host(DType::u8, {13});
  for (int i = 0; i < 13; ++i) bytes_in.as<uint8_t>()[i] = static_cast<uint8_t>(200 + i);
  gpu_->copy(bytes_in, bytes_dev);
  gpu_->copy(bytes_dev, bytes_out);
  gpu_->synchronize();
  for (int i = 0; i < 13; ++i) EXPECT_EQ(bytes_out.as<uint8_t>()[i], 200 + i) << i;
  EXPECT_THROW(gpu_->copy(bytes_in, dev), Error);
}

TEST_F(CudaOps, GatherHostRowsReadsEachRowAtItsAddressAndLeavesAddressZerosRows) {
  // Rows of 8200 bytes (two pieces of a block each, 16-byte aligned) and of 1030 bytes at odd addresses (the
  // byte path), from page-locked memory the backend reads in place, eagerly and from a recording that reads
  // the addresses (and the rows) as they are at replay. The CPU backend computes the same.
  for (const int64_t row_bytes : {int64_t{8200}, int64_t{1030}}) {
    const int64_t D = row_bytes / 2, misalign = row_bytes % 16 == 0 ? 0 : 1;
    Tensor host = gpu_->alloc_host(DType::u8, {4 * row_bytes + 16});
    ASSERT_TRUE(gpu_->reads_in_place(host.data));
    auto* base = host.as<uint8_t>() + misalign;
    for (int64_t i = 0; i < 4 * row_bytes; ++i) base[i] = static_cast<uint8_t>(i * 7 + 3);
    Tensor src = gpu_->alloc_host(DType::i64, {3});
    const auto address = [&](int64_t r) {
      return static_cast<int64_t>(reinterpret_cast<uintptr_t>(base + r * row_bytes));
    };
    src.as<int64_t>()[0] = address(3);
    src.as<int64_t>()[1] = 0;
    src.as<int64_t>()[2] = address(1);
    Tensor dev_src = gpu_->alloc(DType::i64, {3}), rows = gpu_->alloc(DType::bf16, {3, D});
    gpu_->fill_i32(rows.view(0, DType::i32, {3 * D / 2}), 0x11111111);
    gpu_->copy(src, dev_src);
    gpu_->gather_host_rows(dev_src, rows);
    std::vector<uint8_t> out(static_cast<size_t>(3 * row_bytes));
    gpu_->download(out.data(), rows);
    for (int64_t i = 0; i < row_bytes; ++i) {
      ASSERT_EQ(out[static_cast<size_t>(i)], base[3 * row_bytes + i]) << row_bytes << " row 0 byte " << i;
      ASSERT_EQ(out[static_cast<size_t>(row_bytes + i)], 0x11) << row_bytes << " row 1 byte " << i;
      ASSERT_EQ(out[static_cast<size_t>(2 * row_bytes + i)], base[row_bytes + i])
          << row_bytes << " row 2 " << i;
    }
    Tensor cpu_rows = cpu_.alloc(DType::bf16, {3, D});
    std::memset(cpu_rows.data, 0x11, cpu_rows.nbytes());
    cpu_.gather_host_rows(src, cpu_rows);
    EXPECT_EQ(std::memcmp(cpu_rows.data, out.data(), out.size()), 0) << row_bytes;

    gpu_->begin_capture();
    gpu_->copy(src, dev_src);
    gpu_->gather_host_rows(dev_src, rows);
    const std::shared_ptr<void> graph = gpu_->end_capture();
    ASSERT_TRUE(graph);
    src.as<int64_t>()[1] = address(0);
    base[0] = 0xEE;
    gpu_->replay(graph);
    gpu_->download(out.data(), rows);
    for (int64_t i = 0; i < row_bytes; ++i)
      ASSERT_EQ(out[static_cast<size_t>(row_bytes + i)], base[i])
          << row_bytes << " replayed row 1 byte " << i;
  }
}

TEST_F(CudaOps, InsertKvRowsOfEveryStageTogetherGiveTheBitsOfTheStageByStageOps) {
  // Three stages of the tiny shapes (H 256 -> d 128, RoPE 32, QDQ blocks of 32; rings of 4 slots x W 16):
  // 1, 5 and 16 rows (every wkv in one tiles launch) and 20 (cuBLAS per stage), with two rows for one entry
  // (the later wins) and a padding row (slot -1). The backend's op (two launches where it can) leaves the
  // rings with the bits of the default's linear, kv_norm_rope_qdq and ring_write stage by stage.
  const int64_t H = cfg_.dim, d = cfg_.head_dim, W = 16, slots = 4, S = 3;
  std::mt19937 g(17);
  std::vector<LinearWeight> wkv;
  std::vector<Tensor> norms;
  for (int64_t i = 0; i < S; ++i) {
    wkv.push_back(
        test::prepared(*gpu_, dense(*gpu_, "wkv", d, H, normal_bf16(g, static_cast<size_t>(d * H), 0.06f))));
    norms.push_back(put(*gpu_, DType::bf16, {d}, normal_bf16(g, static_cast<size_t>(d), 0.2f, 1.0f)));
  }
  ASSERT_FALSE(wkv[0].tiles.empty());
  for (const int64_t rows : {int64_t{1}, int64_t{5}, int64_t{16}, int64_t{20}}) {
    SCOPED_TRACE(rows);
    const Tensor x = put(*gpu_, DType::bf16, {rows, H}, normal_bf16(g, static_cast<size_t>(rows * H), 1.0f));
    std::vector<int32_t> pos(static_cast<size_t>(rows)), slot(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      pos[static_cast<size_t>(r)] = static_cast<int32_t>(3 + 7 * r);
      slot[static_cast<size_t>(r)] = static_cast<int32_t>(r % slots);
    }
    if (rows >= 5) {
      pos[4] = pos[0] + static_cast<int32_t>(4 * W);  // slot 0 again, the same entry: row 4 wins
      slot[static_cast<size_t>(rows - 1)] = -1;
    }
    const Tensor p = put_i32(*gpu_, {rows}, pos), sl = put_i32(*gpu_, {rows}, slot);
    std::vector<const LinearWeight*> wkvs;
    for (const LinearWeight& w : wkv) wkvs.push_back(&w);
    const std::vector<InsertKvStage> stages[2] = {
        test::empty_insert_stages(*gpu_, wkvs, norms, slots, W, d, rows),
        test::empty_insert_stages(*gpu_, wkvs, norms, slots, W, d, rows)};
    const KvRowParams kp{static_cast<float>(cfg_.norm_eps), cfg_.rope_head_dim, cfg_.rope_theta,
                         cfg_.weight_block_size};
    gpu_->insert_kv_rows(x, {}, stages[0], p, sl, kp);
    gpu_->Backend::insert_kv_rows(x, {}, stages[1], p, sl, kp);
    for (size_t i = 0; i < static_cast<size_t>(S); ++i) {
      expect_same_bits(fetch(*gpu_, "ring_kv", stages[1][i].ring_kv),
                       fetch(*gpu_, "ring_kv", stages[0][i].ring_kv));
      expect_same_bits(fetch(*gpu_, "ring_pos", stages[1][i].ring_pos),
                       fetch(*gpu_, "ring_pos", stages[0][i].ring_pos));
    }
    // The positions where a sequential write in row order leaves them (the later row for an entry wins, the
    // padding row goes nowhere).
    std::vector<int32_t> want(static_cast<size_t>(slots * W), -1);
    for (int64_t r = 0; r < rows; ++r)
      if (slot[static_cast<size_t>(r)] >= 0)
        want[static_cast<size_t>(slot[static_cast<size_t>(r)] * W + pos[static_cast<size_t>(r)] % W)] =
            pos[static_cast<size_t>(r)];
    for (const InsertKvStage& st : stages[0]) EXPECT_EQ(test::to_i32(*gpu_, st.ring_pos), want);
  }
}

TEST_F(CudaOps, WaitForWordReturnsOnceTheCopysLastWordIsThereAndFailsWhenItNeverComes) {
  // A recorded step's answer: words from the device, the last one a ticket the host waits for instead of a
  // stream sync. Each replay's answer must be whole when its ticket shows.
  const int64_t n = 97;
  Tensor host_in = gpu_->alloc_host(DType::i32, {n}), dev = gpu_->alloc(DType::i32, {n});
  Tensor host_out = gpu_->alloc_host(DType::i32, {n});
  gpu_->begin_capture();
  gpu_->copy(host_in, dev);
  gpu_->copy(dev, host_out);
  const std::shared_ptr<void> graph = gpu_->end_capture();
  ASSERT_TRUE(graph);
  const Tensor ticket = host_out.view((n - 1) * 4, DType::i32, {1});
  for (int32_t round = 1; round <= 20; ++round) {
    for (int64_t i = 0; i < n - 1; ++i) host_in.as<int32_t>()[i] = static_cast<int32_t>(round * 1000 + i);
    host_in.as<int32_t>()[n - 1] = round;
    gpu_->replay(graph);
    gpu_->wait_for_word(ticket, round);
    for (int64_t i = 0; i < n - 1; ++i) ASSERT_EQ(host_out.as<int32_t>()[i], round * 1000 + i) << round;
  }
  gpu_->synchronize();
  // Nothing queued will write 21: the stream is idle, and the wait says so instead of spinning forever.
  try {
    gpu_->wait_for_word(ticket, 21);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("finished without writing 21"), std::string::npos) << e.what();
  }
}

TEST_F(CudaOps, EmbedIsAnExactGather) {
  std::mt19937 g(2);
  const std::vector<float> table = normal_bf16(g, static_cast<size_t>(cfg_.vocab_size * cfg_.dim), 1.0f);
  std::vector<int32_t> ids(static_cast<size_t>(T_));
  for (int32_t& id : ids) id = static_cast<int32_t>(g() % cfg_.vocab_size);
  ids[1] = 0, ids[2] = static_cast<int32_t>(cfg_.vocab_size - 1);
  auto [cpu, gpu] = run([&](Backend& be) {
    Tensor t = put(be, DType::bf16, {cfg_.vocab_size, cfg_.dim}, table),
           out = be.alloc(DType::bf16, {T_, cfg_.dim});
    be.embed(t, put_i32(be, {T_}, ids), out);
    return Outs{fetch(be, "embed", out)};
  });
  test::expect_same_bits(cpu[0], gpu[0]);
}

TEST_F(CudaOps, LinearBf16AndF32OutputsAtEveryDrafterShape) {
  const int64_t H = cfg_.dim, heads_d = cfg_.n_heads * cfg_.head_dim, oa = cfg_.o_groups * cfg_.o_lora_rank;
  struct Case {
    const char* name;
    int64_t T, in, out;
    DType dt;
  };
  // main_proj, wq_a, wq_b, wkv, wo_b (f32 partial), head (f32 logits), w1 (I x H), w2 (H x I); T = 1 too.
  // Also 5, 8, 16, 17 and 40 rows, and rows wider than 4096 elements.
  const Case cases[] = {{"main_proj", T_, 3 * H, H, DType::bf16},
                        {"wq_a", T_, H, cfg_.q_lora_rank, DType::bf16},
                        {"wq_b", T_, cfg_.q_lora_rank, heads_d, DType::bf16},
                        {"wkv", T_, H, cfg_.head_dim, DType::bf16},
                        {"wo_b", T_, oa, H, DType::f32},
                        {"head", T_, H, cfg_.vocab_size, DType::f32},
                        {"w1", T_, H, cfg_.moe_inter_dim, DType::bf16},
                        {"w2", T_, cfg_.moe_inter_dim, H, DType::bf16},
                        {"one_row", 1, H, cfg_.q_lora_rank, DType::bf16},
                        {"one_row_f32", 1, oa, H, DType::f32},
                        {"rows_5_out_72", 5, H, 72, DType::bf16},
                        {"rows_8", 8, H, 96, DType::bf16},
                        {"wide_rows", 5, 4096 + 512, 64, DType::f32},
                        {"rows_16", 16, H, 72, DType::bf16},
                        {"rows_17", 17, H, 72, DType::bf16},
                        {"rows_40_f32", 40, oa, H, DType::f32}};
  std::mt19937 g(3);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<float> x = normal_bf16(g, static_cast<size_t>(c.T * c.in), 1.0f);
    const std::vector<float> w =
        normal_bf16(g, static_cast<size_t>(c.out * c.in), 1.0f / std::sqrt(float(c.in)));
    auto [cpu, gpu] = run([&](Backend& be) {
      Tensor out = be.alloc(c.dt, {c.T, c.out});
      be.linear(put(be, DType::bf16, {c.T, c.in}, x), dense(be, c.name, c.out, c.in, w), out);
      return Outs{fetch(be, c.name, out)};
    });
    test::expect_near_scale(cpu[0], gpu[0], c.dt == DType::f32 ? test::kF32 : test::kOneRounding);
  }
}

TEST_F(CudaOps, GroupedLinearIsBlockDiagonal) {
  // wo_a: o [T, heads * d] in 4 groups of 2 heads, each through its own [o_lora, 2 d] block.
  const int64_t G = cfg_.o_groups, in_g = cfg_.n_heads * cfg_.head_dim / G, out = G * cfg_.o_lora_rank;
  std::mt19937 g(4);
  for (const int64_t T : {int64_t{5}, T_, int64_t{20}}) {
    SCOPED_TRACE(T);
    const std::vector<float> x = normal_bf16(g, static_cast<size_t>(T * G * in_g), 1.0f);
    const std::vector<float> w =
        normal_bf16(g, static_cast<size_t>(out * in_g), 1.0f / std::sqrt(float(in_g)));
    auto [cpu, gpu] = run([&](Backend& be) {
      Tensor o = be.alloc(DType::bf16, {T, out});
      be.grouped_linear(put(be, DType::bf16, {T, G * in_g}, x), dense(be, "wo_a", out, in_g, w), G, o);
      return Outs{fetch(be, "wo_a", o)};
    });
    test::expect_near_scale(cpu[0], gpu[0], test::kOneRounding);
  }
}

TEST_F(CudaOps, RmsNormRows) {
  std::mt19937 g(5);
  // The tiny config's widths (<= 256: one block of outputs per row), V4.1's hidden width 5120 (20 blocks per
  // row) and 1001 (a partial last block, off the 8-element path).
  for (const int64_t n : {cfg_.dim, cfg_.q_lora_rank, cfg_.head_dim, int64_t{5120}, int64_t{1001}}) {
    SCOPED_TRACE(n);
    const std::vector<float> x = normal_bf16(g, static_cast<size_t>(T_ * n), 3.0f);
    const std::vector<float> w = normal_bf16(g, static_cast<size_t>(n), 0.02f, 1.0f);
    auto [cpu, gpu] = run([&](Backend& be) {
      Tensor out = be.alloc(DType::bf16, {T_, n});
      be.rms_norm(put(be, DType::bf16, {T_, n}, x), put(be, DType::bf16, {n}, w),
                  static_cast<float>(cfg_.norm_eps), out);
      return Outs{fetch(be, "rms_norm", out)};
    });
    test::expect_near_scale(cpu[0], gpu[0], test::kOneRounding);
  }
}

TEST_F(CudaOps, RopeForwardAndInverseOnQueriesAndKv) {
  std::mt19937 g(6);
  std::vector<int32_t> pos(static_cast<size_t>(T_));
  for (size_t t = 0; t < pos.size(); ++t) pos[t] = static_cast<int32_t>(t < 5 ? t : g() % 200000);  // far too
  // 8 heads x 16 pairs fit one block of threads per token; 64 heads (V4.1's) need 4.
  for (const int64_t heads : {cfg_.n_heads, int64_t{1}, int64_t{64}})
    for (const bool inverse : {false, true}) {
      SCOPED_TRACE(testing::Message() << heads << " heads, inverse " << inverse);
      const std::vector<float> x = normal_bf16(g, static_cast<size_t>(T_ * heads * cfg_.head_dim), 1.0f);
      auto [cpu, gpu] = run([&](Backend& be) {
        Tensor t = put(be, DType::bf16, {T_, heads, cfg_.head_dim}, x);
        be.rope(t, put_i32(be, {T_}, pos), cfg_.rope_head_dim, cfg_.rope_theta, inverse);
        return Outs{fetch(be, "rope", t)};
      });
      test::expect_near_scale(cpu[0], gpu[0], test::kOneRounding);
      // The first d - r dims are not rotated: bit-identical.
      const std::vector<float> a = cpu[0].values(), b = gpu[0].values();
      for (size_t i = 0; i < a.size(); ++i)
        if (static_cast<int64_t>(i) % cfg_.head_dim < cfg_.head_dim - cfg_.rope_head_dim) {
          ASSERT_EQ(a[i], b[i]) << i;
        }
    }
}

TEST_F(CudaOps, KvQdqIsExact) {
  // Same bf16 inputs, power-of-two scales, round-to-nearest-even e4m3: no freedom, so the bits must match.
  std::mt19937 g(7);
  std::vector<float> x = normal_bf16(g, static_cast<size_t>(T_ * cfg_.head_dim), 2.0f);
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero block (the 1e-4 floor)
  x[40] = round_bf16(448.0f * 0.5f);                              // a block whose amax is 2^n * 448
  auto [cpu, gpu] = run([&](Backend& be) {
    Tensor t = put(be, DType::bf16, {T_, cfg_.head_dim}, x);
    be.kv_qdq(t, cfg_.weight_block_size);
    return Outs{fetch(be, "kv_qdq", t)};
  });
  test::expect_same_bits(cpu[0], gpu[0]);
}

TEST_F(CudaOps, FusedKvNormRopeQdqEqualsTheThreeOpsBitForBit) {
  // The fused kernel repeats each separate kernel's arithmetic: the same bits as rms_norm, rope and kv_qdq
  // run in turn on the GPU, at the tiny head size (128) and V4.1's (512), for 15 rows and 1; and within the
  // separate ops' tolerance of the CPU reference (the default composition).
  std::mt19937 g(9);
  for (const int64_t d : {cfg_.head_dim, int64_t{512}})
    for (const int64_t N : {T_, int64_t{1}}) {
      SCOPED_TRACE(testing::Message() << "d " << d << ", " << N << " rows");
      const std::vector<float> x = normal_bf16(g, static_cast<size_t>(N * d), 3.0f);
      const std::vector<float> w = normal_bf16(g, static_cast<size_t>(d), 0.02f, 1.0f);
      std::vector<int32_t> pos(static_cast<size_t>(N));
      for (size_t t = 0; t < pos.size(); ++t) pos[t] = static_cast<int32_t>(t < 5 ? t : g() % 200000);
      const float eps = static_cast<float>(cfg_.norm_eps);
      const auto fused = [&](Backend& be) {
        Tensor out = be.alloc(DType::bf16, {N, d});
        be.kv_norm_rope_qdq(put(be, DType::bf16, {N, d}, x), put(be, DType::bf16, {d}, w), eps,
                            put_i32(be, {N}, pos), cfg_.rope_head_dim, cfg_.rope_theta,
                            cfg_.weight_block_size, out);
        return fetch(be, "fused", out);
      };
      const auto separate = [&](Backend& be) {
        Tensor out = be.alloc(DType::bf16, {N, d});
        be.rms_norm(put(be, DType::bf16, {N, d}, x), put(be, DType::bf16, {d}, w), eps, out);
        be.rope(out.reshaped({N, 1, d}), put_i32(be, {N}, pos), cfg_.rope_head_dim, cfg_.rope_theta, false);
        be.kv_qdq(out, cfg_.weight_block_size);
        return fetch(be, "separate", out);
      };
      test::expect_same_bits(separate(*gpu_), fused(*gpu_));
      // fp8 rounding can amplify a 1-ulp RMSNorm difference to one e4m3 step (2^-3 relative) of an element.
      const test::Out want = fused(cpu_), got = fused(*gpu_);
      const std::vector<float> a = want.values(), b = got.values();
      size_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
      EXPECT_LE(differ, a.size() / 50) << "elements off the CPU's value";
    }
}

TEST_F(CudaOps, SideBranchStartsAfterMainWorkAndJoinsBeforeLaterMainWork) {
  // Two chains a -> b (main) -> c (a side lane) -> d (main after the join) of 4M-element conversions, one
  // through each lane, both joined by one join_side(): each link reads what the one before wrote, so a
  // missing fork or join edge leaves stale values (the buffers start as zeros and each chain ends in
  // bf16(a)). Eagerly and replayed from a recording.
  constexpr int64_t n = 1 << 22;
  std::vector<float> a(n);
  for (int64_t i = 0; i < n; ++i) a[static_cast<size_t>(i)] = static_cast<float>(i % 1000) + 0.5f;
  CudaBackend& be = *gpu_;
  using Lane = Backend::SideLane;
  struct Chain {
    Lane lane;
    Tensor a, b, c, d;
  };
  std::vector<Chain> chains;
  for (const Lane lane : {Lane::insert, Lane::step})
    chains.push_back({lane, put(be, DType::f32, {n}, a), be.alloc(DType::bf16, {n}),
                      be.alloc(DType::f32, {n}), be.alloc(DType::bf16, {n})});
  const auto run_chains = [&] {
    for (const Chain& c : chains) {
      be.convert(c.a, c.b);
      be.begin_side(c.lane);
      EXPECT_THROW(be.begin_side(Lane::step), Error);  // one side branch at a time
      EXPECT_THROW(be.begin_side(Lane::insert), Error);
      be.convert(c.b, c.c);
      be.end_side();
    }
    be.join_side();
    for (const Chain& c : chains) be.convert(c.c, c.d);
  };
  const test::Out want = fetch(cpu_, "bf16(a)", put(cpu_, DType::bf16, {n}, a));  // each chain's exact result
  run_chains();
  for (const Chain& c : chains) test::expect_same_bits(want, fetch(be, "eager", c.d));
  for (const Chain& c : chains)
    for (const Tensor& t : {c.b, c.c, c.d}) be.zero(t);
  be.begin_capture();
  run_chains();
  const std::shared_ptr<void> graph = be.end_capture();
  ASSERT_TRUE(graph) << "the recording must hold every branch, joined";
  for (const Chain& c : chains) EXPECT_EQ(fetch(be, "before replay", c.d).values()[1], 0.0f);  // ran nothing
  be.replay(graph);
  for (const Chain& c : chains) test::expect_same_bits(want, fetch(be, "replayed", c.d));
}

TEST_F(CudaOps, ConvertRoundsToNearestEven) {
  std::mt19937 g(8);
  std::vector<float> f(1000);
  std::normal_distribution<float> d(0.0f, 10.0f);
  for (float& v : f) v = d(g);
  // Exact halfway cases: 1 + 2^-8 -> 1 (even), 1 + 3 * 2^-8 -> 1 + 2^-6 (even), and their negatives.
  f[0] = 1.0f + 0x1p-8f, f[1] = 1.0f + 3 * 0x1p-8f, f[2] = -f[0], f[3] = -f[1], f[4] = 0.0f, f[5] = -0.0f;
  const std::vector<float> b = normal_bf16(g, 777, 5.0f);
  auto [cpu, gpu] = run([&](Backend& be) {
    Tensor f32 = put(be, DType::f32, {1000}, f), to_bf16 = be.alloc(DType::bf16, {1000});
    Tensor bf = put(be, DType::bf16, {777}, b), to_f32 = be.alloc(DType::f32, {777});
    be.convert(f32, to_bf16);
    be.convert(bf, to_f32);
    return Outs{fetch(be, "f32->bf16", to_bf16), fetch(be, "bf16->f32", to_f32)};
  });
  for (size_t n = 0; n < cpu.size(); ++n) test::expect_same_bits(cpu[n], gpu[n]);
}

}  // namespace
}  // namespace dspark
