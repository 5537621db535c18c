/* dspark_client: the C client of a dspark worker's host interface (SPEC §7).
 *
 * An inference engine (the host) attaches to a worker through its Unix socket (named by its config's
 * ring.name) and talks to it over shared memory the worker hands it, then sends steps: resets, context rows
 * for slots, and one batch of draft requests, answered with draft tokens, confidences and margins. One host
 * at a time per worker; one thread at a time per client handle. Every call returns a status; on any status
 * but DSPARK_OK, dspark_last_error() says why. A worker that dies or stops answering makes calls return
 * DSPARK_UNAVAILABLE instead of hanging. */
#ifndef DSPARK_CLIENT_H
#define DSPARK_CLIENT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dspark_status {
  DSPARK_OK = 0,
  DSPARK_INVALID_ARGUMENT = 1,   /* a slot, token, position, k' or size out of range: nothing changed */
  DSPARK_RESOURCE_EXHAUSTED = 2, /* batch or rows over the worker's limits */
  DSPARK_UNAVAILABLE = 3,        /* worker starting, draining, unhealthy, gone, or not answering in time */
  DSPARK_INTERNAL = 4 /* the step failed on the worker; its slots were reset: re-send their context */
} dspark_status;

typedef struct dspark_client dspark_client;

typedef struct dspark_model_info {
  uint32_t vocab_size;
  uint32_t hidden;     /* H */
  uint32_t taps;       /* a context row is taps * H bf16 values */
  uint32_t row_bytes;  /* taps * H * 2 */
  uint32_t block_size; /* k: outputs per draft request */
  uint32_t window;     /* W */
  uint32_t slots;
  uint32_t max_batch;        /* draft requests per step */
  uint32_t max_context_rows; /* per message; larger sends are split by the client */
  uint32_t tp;
  int64_t max_model_len;
  uint32_t
      weight_formats; /* bit (1 << DSPARK_FORMAT_*) of every representation of the loaded linear weights */
  uint32_t
      head_format; /* the head as loaded: DSPARK_FORMAT_FP8_BLOCK when re-quantised (weights.head: fp8) */
} dspark_model_info;

/* Weight representations, as dspark_model_info names them. */
enum {
  DSPARK_FORMAT_DENSE = 0,
  DSPARK_FORMAT_FP8_BLOCK = 1, /* e4m3 weights, one e8m0 scale per B x B block */
  DSPARK_FORMAT_FP4 = 2,       /* e2m1 weights, one e8m0 scale per 32 inputs */
  DSPARK_FORMAT_EXL3 = 3
};

typedef struct dspark_draft_request {
  int32_t slot;
  int32_t token;   /* anchor token: the last accepted token */
  int32_t pos;     /* its position P (the last context position + 1) */
  int32_t low;     /* lowest context position attended; -1: max(0, P - W) */
  int32_t outputs; /* k' in 1..k (0 = k); outputs past k' are 0 */
  /* A report on this slot's previous draft, for the worker's acceptance metrics (it does not change this
   * draft): with has_accepted nonzero, accepted = how many of that draft's tokens the target accepted (0 to
   * its k'). Zero-initialised: no report. */
  int32_t has_accepted;
  int32_t accepted;
} dspark_draft_request;

/* Sampled drafts (protocol version 7; SPEC §4): per request, a temperature (0: the greedy draft; up to the
 * worker's max_temperature, 100), the seed of its Gumbel noise (the same seed and context draw the same
 * tokens), and DSPARK_SAMPLE_DISTRIBUTION to receive its whole draft distribution q_j at every position
 * j < k' (temperature > 0 only; at most max_distributions requests per step: dspark_sampling_limits). */
enum { DSPARK_SAMPLE_DISTRIBUTION = 1 };
typedef struct dspark_sampling {
  float temperature;
  uint32_t flags; /* DSPARK_SAMPLE_DISTRIBUTION */
  uint64_t seed;
} dspark_sampling;

/* What a sampled step answers besides dspark_draft_output; every pointer may be NULL. */
typedef struct dspark_sampled_output {
  float* q; /* [n * k]: the drafted token's probability under the draft distribution (1 greedy, 0 past k') */
  /* The whole distributions asked for, in request then position order: row r is distribution[r V, (r+1) V)
   * for request distribution_rows[r] / k at position distribution_rows[r] % k. Room for
   * distribution_capacity rows; the count is written to *distributions (a step answering more rows than
   * the room fails with DSPARK_INVALID_ARGUMENT, its drafts still written). */
  float* distribution;
  int32_t* distribution_rows;
  uint32_t distribution_capacity;
  uint32_t* distributions;
} dspark_sampled_output;

/* One slot's context rows in a dspark_step. (Not named dspark_context: that is the function below, and one
 * identifier cannot be both a typedef and a function in C or C++.) */
typedef struct dspark_context_block {
  int32_t slot;
  int32_t first_pos;
  int32_t rows;
  const void* data; /* rows * row_bytes bytes: bf16 values, row-major */
} dspark_context_block;

/* Outputs of a draft batch of n requests: arrays of n * k (k = block_size); NULL to skip one. */
typedef struct dspark_draft_output {
  int32_t* ids;
  float* conf; /* sigmoid of the confidence logit: probability the token is accepted */
  float* conf_logit;
  float* margin; /* top1 - top2 of logits + Markov bias; 0 when margins were not asked for */
} dspark_draft_output;

typedef struct dspark_stats {
  uint64_t steps, failed_steps, rejected_messages;
  uint64_t drafts, context_rows, resets;
  uint64_t hosts_attached, hosts_lost;
  double step_us_p50, step_us_p99, step_us_max;
  uint64_t hosts_refused; /* connections refused: another uid, a second host, a bad hello */
} dspark_stats;

/* What the stats answer adds from protocol version 6 on (since the worker started). */
#define DSPARK_HOT_UNCACHED_TOKENS 8
typedef struct dspark_serving_stats {
  uint64_t acceptance_reports, accepted_tokens;   /* accepted / reports: the mean accepted length */
  uint64_t markov_lookups, markov_hits;           /* the Markov bias cache: hits / lookups is its hit rate */
  uint32_t hot_uncached;                          /* entries in use below, most seen first */
  int32_t hot_tokens[DSPARK_HOT_UNCACHED_TOKENS]; /* the most seen previous tokens the cache does not hold */
  uint64_t hot_seen[DSPARK_HOT_UNCACHED_TOKENS];  /* how often each was seen */
} dspark_serving_stats;

typedef enum dspark_worker_state {
  DSPARK_STARTING = 0,
  DSPARK_SERVING = 1,
  DSPARK_DRAINING = 2,
  DSPARK_UNHEALTHY = 3,
  DSPARK_STOPPED = 4
} dspark_worker_state;

typedef struct dspark_health {
  uint32_t state; /* dspark_worker_state */
  uint32_t tp;
  uint64_t steps;
  uint32_t failed_in_a_row;
} dspark_health;

/* Attaches to the worker of ring name `name` (its config's ring.name, e.g. "/dspark-tiny": the socket
 * <dir>/dspark-tiny.sock, dir being $XDG_RUNTIME_DIR/dspark when set, else /tmp/dspark-<euid>; a name holding
 * a '/' after its first character is the socket's full path), waiting up to timeout_ms (>= 0; negative is
 * DSPARK_INVALID_ARGUMENT) for it to exist and serve. The worker must run as this process's effective uid:
 * another one is refused before anything is sent. On DSPARK_OK *out is a new handle (free it with
 * dspark_detach); on failure *out is NULL and dspark_last_error(NULL) holds the reason. */
dspark_status dspark_attach(const char* name, int32_t timeout_ms, dspark_client** out);
/* dspark_attach to a worker that runs as `worker_uid` (one of another user, whose config names this
 * process's group in ring.group; docs/clients.md "Security model"). */
dspark_status dspark_attach_as(const char* name, uint32_t worker_uid, int32_t timeout_ms,
                               dspark_client** out);
/* Tells the worker (which resets the slots this host wrote and ends the session) and frees the handle. NULL
 * is ignored. */
void dspark_detach(dspark_client* c);
/* The reason of the last failed call on c (or of the last failed attach, for NULL). Valid until the next
 * call. */
const char* dspark_last_error(const dspark_client* c);
const char* dspark_status_name(dspark_status s);
/* The host-interface protocol version this library speaks (docs/clients.md, "Protocol versions"). A worker
 * that does not serve it refuses the attach: DSPARK_UNAVAILABLE, the reason naming both versions. */
uint32_t dspark_protocol_version(void);
/* Per-call wait limit in ms (default 30000; 0 = answers already there only); a call past it returns
 * DSPARK_UNAVAILABLE. A step split into several messages shares one limit. A negative limit (or a NULL
 * handle) is DSPARK_INVALID_ARGUMENT and leaves the limit as it was. */
dspark_status dspark_set_timeout(dspark_client* c, int32_t timeout_ms);

dspark_status dspark_model(const dspark_client* c, dspark_model_info* out);
/* The target layers whose hidden streams make a context row's taps, in row order (dspark_target_layer_ids:
 * for V4.1 the input stream of each layer, averaged over its hc copies), and the token that fills block
 * positions 1..k-1 (dspark_noise_token_id). Writes min(taps, capacity) ids into layer_ids (may be NULL when
 * capacity is 0), the count into *taps and the token into *noise_token (either may be NULL). */
dspark_status dspark_model_taps(const dspark_client* c, int32_t* layer_ids, uint32_t capacity, uint32_t* taps,
                                int32_t* noise_token);
dspark_status dspark_reset(dspark_client* c, const int32_t* slots, uint32_t n);
/* Context rows of one slot at positions first_pos .. first_pos + rows - 1. */
dspark_status dspark_context(dspark_client* c, int32_t slot, int32_t first_pos, const void* rows,
                             int32_t n_rows);
dspark_status dspark_draft(dspark_client* c, const dspark_draft_request* reqs, uint32_t n, int margins,
                           dspark_draft_output out);
/* Resets, then context rows, then one draft batch (n may be 0), in one round trip when it fits one message;
 * context beyond a message's room goes ahead in context-only messages. A split step is checked whole by the
 * client first (slots, positions, tokens, k', window); should the worker still fail a later part, the earlier
 * parts stay applied and dspark_last_error() names the part. */
dspark_status dspark_step(dspark_client* c, const int32_t* resets, uint32_t n_resets,
                          const dspark_context_block* ctx, uint32_t n_ctx, const dspark_draft_request* reqs,
                          uint32_t n, int margins, dspark_draft_output out);
/* dspark_step with sampled requests: sampling[i] for reqs[i] (sampling NULL: every request greedy). */
dspark_status dspark_step_sampled(dspark_client* c, const int32_t* resets, uint32_t n_resets,
                                  const dspark_context_block* ctx, uint32_t n_ctx,
                                  const dspark_draft_request* reqs, const dspark_sampling* sampling,
                                  uint32_t n, int margins, dspark_draft_output out,
                                  dspark_sampled_output sampled);
/* Requests per step that may ask for their whole distribution, and the largest temperature; either pointer
 * may be NULL. */
dspark_status dspark_sampling_limits(const dspark_client* c, uint32_t* max_distributions,
                                     float* max_temperature);
dspark_status dspark_set_max_model_len(dspark_client* c, int64_t max_model_len);
dspark_status dspark_stats_get(dspark_client* c, dspark_stats* out);
/* One stats round trip filling both parts; either pointer may be NULL. */
dspark_status dspark_serving_stats_get(dspark_client* c, dspark_stats* stats, dspark_serving_stats* more);
dspark_status dspark_health_get(dspark_client* c, dspark_health* out);

#ifdef __cplusplus
}
#endif

#endif /* DSPARK_CLIENT_H */
