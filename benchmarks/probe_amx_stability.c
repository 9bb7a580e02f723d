/* Probe (issue 26, session 17): is AMX throughput stable on this host? Times the AMX GEMV inner step of
 * kernels/cpu_gemv.c (one x row tile, four 16x32 bf16 weight tiles, four TDPBF16PS: 4 KB of weights, L1-resident)
 * and the same multiply-adds with AVX512-BF16 (64 vdpbf16ps), 40 samples of 200k iterations 0.2 s apart.
 *   gcc -O2 -mavx512f -mavx512bf16 -mamx-tile -mamx-bf16 benchmarks/probe_amx_stability.c -o /tmp/amx && /tmp/amx
 * Session 17, 2-vCPU KVM guest on an Intel Xeon (2.1 GHz): AMX 27-303 ns per step over the 40 samples (most at
 * 144-168, some at 28), AVX512 52-88 ns, nearly all 52-58. The same L1-resident work varies 10x with AMX only, so
 * the whole-step A/B of AMX (33-42 vs 62-74 tok/s at batch 1) measured the host, not tile configure/release
 * (a copy that configures once per thread and never releases was as bimodal: 9.0-23.1 ms vs 9.0-22.9). */
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  syscall(SYS_arch_prctl, 0x1023, 18);
  cfg_t c; memset(&c,0,sizeof c); c.palette=1;
  for(int i=0;i<5;i++){c.rows[i]=1;c.colsb[i]=64;} for(int i=5;i<8;i++){c.rows[i]=16;c.colsb[i]=64;}
  _tile_loadconfig(&c);
  static uint16_t w[16*128*4] __attribute__((aligned(64))); static uint16_t x[64] __attribute__((aligned(64)));
  for(int i=0;i<16*128*4;i++) w[i]=0x3f80; for(int i=0;i<64;i++) x[i]=0x3f80;
  __m512 acc = _mm512_setzero_ps(); __m512bh wv = (__m512bh)_mm512_set1_epi16(0x3f80), xv=wv;
  for(int s=0;s<40;s++){
    double t0=now();
    for(int it=0;it<200000;it++){
      _tile_loadd(4,x,128);
      _tile_loadd(5,w,256); _tile_dpbf16ps(0,4,5);
      _tile_loadd(6,w+32,256); _tile_dpbf16ps(1,4,6);
      _tile_loadd(7,w+64,256); _tile_dpbf16ps(2,4,7);
      _tile_loadd(5,w+96,256); _tile_dpbf16ps(3,4,5);
    }
    double t1=now();
    __m512 a0=acc,a1=acc,a2=acc,a3=acc;
    for(int it=0;it<200000*16;it++){ a0=_mm512_dpbf16_ps(a0,wv,xv); a1=_mm512_dpbf16_ps(a1,wv,xv); a2=_mm512_dpbf16_ps(a2,wv,xv); a3=_mm512_dpbf16_ps(a3,wv,xv);}
    acc=_mm512_add_ps(_mm512_add_ps(a0,a1),_mm512_add_ps(a2,a3));
    double t2=now();
    printf("amx %.1f ns/iter (4KB w)   avx %.1f ns/16 iters\n",(t1-t0)/200000*1e9,(t2-t1)/200000*1e9); fflush(stdout);
    usleep(200000);
  }
  float f[16]; _mm512_storeu_ps(f,acc); return (int)f[0]&1;
}
