
// kernel stitch_c0_k0: grid 4 x block 128
// 2 block(s)/SM x SMs = 4 per wave, limited by threads per SM; 6 task(s) per loop at most -> grid 4; register cap relaxed to 64 keeping 2 block(s)/SM
extern "C" __global__ void __launch_bounds__(128, 8) stitch_c0_k0(
    const __half* __restrict__ in_dy,
    const __half* __restrict__ in_x,
    const float* __restrict__ in_gamma,
    const float* __restrict__ in_mean,
    const float* __restrict__ in_rstd,
    float* __restrict__ out_reduce_sum_14,
    float* __restrict__ out_reduce_sum_15,
    __half* __restrict__ out_cast_30) {
  const long long sf_tid = threadIdx.x;
  const long long sf_bid = blockIdx.x;
  const long long sf_gdim = gridDim.x;
  const long long sf_lane = threadIdx.x & 31u;
  const long long sf_warp = threadIdx.x >> 5;
  __shared__ __align__(16) float smem_19[4];
  __shared__ __align__(16) float smem_22[4];
  // loop 0: 2 task(s)
  for (long long t_1 = sf_bid; t_1 < 2LL; t_1 += sf_gdim) {
    long long row0_2;
    long long col_3;
    long long r0_4;
    float acc_5;
    row0_2 = (t_1 * 1LL);
    // group 0: reduce, column_tiles
    col_3 = (((t_1 / 1LL) * 128LL) + sf_tid);
    r0_4 = ((t_1 % 1LL) * 24LL);
    acc_5 = 0.0f;
    for (long long i_6 = r0_4; i_6 < ((col_3 < 200LL) ? sf_min((r0_4 + 24LL), 24LL) : 0LL); i_6 += 1LL) {
      __half n0_7;
      float n5_8;
      __half n1_9;
      float n6_10;
      float n3_11;
      float n10_12;
      float n4_13;
      float n12_14;
      float n13_15;
      n0_7 = in_dy[((i_6 * 200LL) + col_3)];
      n5_8 = static_cast<float>(sf_f(n0_7));
      n1_9 = in_x[((i_6 * 200LL) + col_3)];
      n6_10 = static_cast<float>(sf_f(n1_9));
      n3_11 = in_mean[(0LL + (((i_6 * 200LL) + col_3) / 200LL))];
      n10_12 = (n6_10 - n3_11);
      n4_13 = in_rstd[(0LL + (((i_6 * 200LL) + col_3) / 200LL))];
      n12_14 = (n10_12 * n4_13);
      n13_15 = (n5_8 * n12_14);
      acc_5 = (acc_5 + n13_15);
    }
    if ((col_3 < 200LL)) {
      float red_16;
      red_16 = acc_5;
      out_reduce_sum_14[col_3] = red_16;
    }
    __syncthreads();
  }
  __syncthreads();
  // loop 1: 2 task(s)
  for (long long t_17 = sf_bid; t_17 < 2LL; t_17 += sf_gdim) {
    long long row0_18;
    long long col_19;
    long long r0_20;
    float acc_21;
    row0_18 = (t_17 * 1LL);
    // group 1: reduce, column_tiles
    col_19 = (((t_17 / 1LL) * 128LL) + sf_tid);
    r0_20 = ((t_17 % 1LL) * 24LL);
    acc_21 = 0.0f;
    for (long long i_22 = r0_20; i_22 < ((col_19 < 200LL) ? sf_min((r0_20 + 24LL), 24LL) : 0LL); i_22 += 1LL) {
      __half n0_23;
      float n5_24;
      n0_23 = in_dy[((i_22 * 200LL) + col_19)];
      n5_24 = static_cast<float>(sf_f(n0_23));
      acc_21 = (acc_21 + n5_24);
    }
    if ((col_19 < 200LL)) {
      float red_25;
      red_25 = acc_21;
      out_reduce_sum_15[col_19] = red_25;
    }
    __syncthreads();
  }
  __syncthreads();
  // loop 2: 6 task(s)
  for (long long t_26 = sf_bid; t_26 < 6LL; t_26 += sf_gdim) {
    long long row0_27;
    long long row_28;
    float acc_29;
    float shfl_35;
    long long row_37;
    float acc_38;
    float shfl_51;
    row0_27 = (t_26 * 4LL);
    // group 2: reduce, warp_per_row
    row_28 = ((t_26 * 4LL) + sf_warp);
    acc_29 = 0.0f;
    for (long long i_30 = sf_lane; i_30 < ((row_28 < 24LL) ? 200LL : 0LL); i_30 += 32LL) {
      __half n0_31;
      float n5_32;
      float n2_33;
      float n17_34;
      n0_31 = in_dy[((row_28 * 200LL) + i_30)];
      n5_32 = static_cast<float>(sf_f(n0_31));
      n2_33 = in_gamma[(0LL + (((row_28 * 200LL) + i_30) % 200LL))];
      n17_34 = (n5_32 * n2_33);
      acc_29 = (acc_29 + n17_34);
    }
    shfl_35 = __shfl_xor_sync(0xffffffffu, acc_29, 16, 32);
    acc_29 = (acc_29 + shfl_35);
    shfl_35 = __shfl_xor_sync(0xffffffffu, acc_29, 8, 32);
    acc_29 = (acc_29 + shfl_35);
    shfl_35 = __shfl_xor_sync(0xffffffffu, acc_29, 4, 32);
    acc_29 = (acc_29 + shfl_35);
    shfl_35 = __shfl_xor_sync(0xffffffffu, acc_29, 2, 32);
    acc_29 = (acc_29 + shfl_35);
    shfl_35 = __shfl_xor_sync(0xffffffffu, acc_29, 1, 32);
    acc_29 = (acc_29 + shfl_35);
    if (((row_28 < 24LL) && (sf_lane == 0LL))) {
      float red_36;
      red_36 = (acc_29 / 200.0f);
      smem_19[(row_28 - row0_27)] = red_36;
    }
    __syncthreads();
    // group 3: reduce, warp_per_row
    row_37 = ((t_26 * 4LL) + sf_warp);
    acc_38 = 0.0f;
    for (long long i_39 = sf_lane; i_39 < ((row_37 < 24LL) ? 200LL : 0LL); i_39 += 32LL) {
      __half n0_40;
      float n5_41;
      float n2_42;
      float n17_43;
      __half n1_44;
      float n6_45;
      float n3_46;
      float n10_47;
      float n4_48;
      float n12_49;
      float n20_50;
      n0_40 = in_dy[((row_37 * 200LL) + i_39)];
      n5_41 = static_cast<float>(sf_f(n0_40));
      n2_42 = in_gamma[(0LL + (((row_37 * 200LL) + i_39) % 200LL))];
      n17_43 = (n5_41 * n2_42);
      n1_44 = in_x[((row_37 * 200LL) + i_39)];
      n6_45 = static_cast<float>(sf_f(n1_44));
      n3_46 = in_mean[(0LL + (((row_37 * 200LL) + i_39) / 200LL))];
      n10_47 = (n6_45 - n3_46);
      n4_48 = in_rstd[(0LL + (((row_37 * 200LL) + i_39) / 200LL))];
      n12_49 = (n10_47 * n4_48);
      n20_50 = (n17_43 * n12_49);
      acc_38 = (acc_38 + n20_50);
    }
    shfl_51 = __shfl_xor_sync(0xffffffffu, acc_38, 16, 32);
    acc_38 = (acc_38 + shfl_51);
    shfl_51 = __shfl_xor_sync(0xffffffffu, acc_38, 8, 32);
    acc_38 = (acc_38 + shfl_51);
    shfl_51 = __shfl_xor_sync(0xffffffffu, acc_38, 4, 32);
    acc_38 = (acc_38 + shfl_51);
    shfl_51 = __shfl_xor_sync(0xffffffffu, acc_38, 2, 32);
    acc_38 = (acc_38 + shfl_51);
    shfl_51 = __shfl_xor_sync(0xffffffffu, acc_38, 1, 32);
    acc_38 = (acc_38 + shfl_51);
    if (((row_37 < 24LL) && (sf_lane == 0LL))) {
      float red_52;
      red_52 = (acc_38 / 200.0f);
      smem_22[(row_37 - row0_27)] = red_52;
    }
    __syncthreads();
    // group 4: output, rowwise
    // 8 elements per thread: in_dy, in_x, out_cast_30 as vectors
    for (long long e_53_v = ((row0_27 * 200LL) + (sf_tid * 8LL)); e_53_v < (sf_min((row0_27 + 4LL), 24LL) * 200LL); e_53_v += (128LL * 8LL)) {
      const sf_vec<__half, 8> in_dy_v = *reinterpret_cast<const sf_vec<__half, 8>*>(in_dy + e_53_v);
      const sf_vec<__half, 8> in_x_v = *reinterpret_cast<const sf_vec<__half, 8>*>(in_x + e_53_v);
      sf_vec<__half, 8> out_cast_30_v;
      #pragma unroll
      for (int e_53_k = 0; e_53_k < 8; ++e_53_k) {
        const long long e_53 = e_53_v + e_53_k;
        float n4_54;
        __half n0_55;
        float n5_56;
        float n2_57;
        float n17_58;
        float n19_59;
        float n24_60;
        __half n1_61;
        float n6_62;
        float n3_63;
        float n10_64;
        float n12_65;
        float n22_66;
        float n26_67;
        float n27_68;
        float n29_69;
        __half n30_70;
        n4_54 = in_rstd[(0LL + (e_53 / 200LL))];
        n0_55 = in_dy_v.v[e_53_k];
        n5_56 = static_cast<float>(sf_f(n0_55));
        n2_57 = in_gamma[(0LL + (e_53 % 200LL))];
        n17_58 = (n5_56 * n2_57);
        n19_59 = smem_19[((0LL + (e_53 / 200LL)) - row0_27)];
        n24_60 = (n17_58 - n19_59);
        n1_61 = in_x_v.v[e_53_k];
        n6_62 = static_cast<float>(sf_f(n1_61));
        n3_63 = in_mean[(0LL + (e_53 / 200LL))];
        n10_64 = (n6_62 - n3_63);
        n12_65 = (n10_64 * n4_54);
        n22_66 = smem_22[((0LL + (e_53 / 200LL)) - row0_27)];
        n26_67 = (n12_65 * n22_66);
        n27_68 = (n24_60 - n26_67);
        n29_69 = (n4_54 * n27_68);
        n30_70 = sf_h(static_cast<float>(n29_69));
        out_cast_30_v.v[e_53_k] = n30_70;
      }
      *reinterpret_cast<sf_vec<__half, 8>*>(out_cast_30 + e_53_v) = out_cast_30_v;
    }
    __syncthreads();
  }
  __syncthreads();
}
