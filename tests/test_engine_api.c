/* test_engine_api.c — the serving engine of host/berth.h on a Gemma 4 fixture checkpoint (CPU backend): requests
 * run concurrently on the engine thread give each one's lone result; a full queue answers BERTH_E_OVERLOADED;
 * cancel finishes a request "cancelled" with its KV freed by the time DONE arrives; n = 4 forks; stop ids stop;
 * requests submitted while the engine is held start in one step; a [kv] memory the device cannot hold beside
 * the weights fails at create. A gate in the callback holds the engine thread still where a test needs
 * determinism. Exits 77 without fixtures. */
#include <pthread.h>
#include <unistd.h>

#include "berth.h"
#include "test_gemma4_fixture.h"
#include "check_run.h"

#define MAXQ 8
#define GEN 6

static char *fixture_dir;
static char *cfg_path;

struct sink {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[MAXQ][4][64];
    int32_t n[MAXQ][4];
    int done[MAXQ][4];
    char finish[MAXQ][4][16];
    int32_t done_tokens[MAXQ][4];
    int32_t blocks_in_use_at_done;
    int n_done;
    int gate_closed;   /* the callback blocks at a TOKEN while set */
    int at_gate;       /* the engine thread is waiting at the gate */
    berth_engine *e;
    int64_t base;      /* request ids start here (slot = id - base) */
};

static void sink_init(struct sink *s, berth_engine *e, int64_t base)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->e = e;
    s->base = base;
}

static void sink_fini(struct sink *s)
{
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

static void on_event(void *arg, const berth_engine_event *ev)
{
    struct sink *s = arg;
    int64_t k = ev->request_id - s->base;
    ck_assert(k >= 0 && k < MAXQ && ev->index >= 0 && ev->index < 4);
    pthread_mutex_lock(&s->mu);
    if (ev->kind == BERTH_EVENT_TOKEN) {
        ck_assert_int_lt(s->n[k][ev->index], 64);
        s->toks[k][ev->index][s->n[k][ev->index]++] = ev->token;
        while (s->gate_closed) {
            s->at_gate = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_cond_wait(&s->cv, &s->mu);
        }
        s->at_gate = 0;
    } else {
        ck_assert_msg(ev->status == BERTH_OK || strcmp(ev->finish_reason, "error") == 0, "%s", ev->message);
        s->done[k][ev->index] = 1;
        s->done_tokens[k][ev->index] = ev->n_tokens;
        snprintf(s->finish[k][ev->index], 16, "%s", ev->finish_reason);
        berth_engine_stats st;
        st.struct_size = sizeof st;
        ck_assert_int_eq(berth_engine_get_stats(s->e, &st), BERTH_OK);
        s->blocks_in_use_at_done = 0;
        for (int32_t g = 0; g < st.n_pools && g < 8; g++) s->blocks_in_use_at_done += st.blocks_in_use[g];
        s->n_done++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

static void wait_done(struct sink *s, int n)
{
    pthread_mutex_lock(&s->mu);
    while (s->n_done < n) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void wait_at_gate(struct sink *s)
{
    pthread_mutex_lock(&s->mu);
    while (!s->at_gate) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void open_gate(struct sink *s)
{
    pthread_mutex_lock(&s->mu);
    s->gate_closed = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static berth_engine *make_engine_tokens(int32_t max_seqs, int32_t queue, int32_t max_batch_tokens)
{
    berth_engine_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.config_path = cfg_path;
    c.model_dir = fixture_dir;
    c.max_seqs = max_seqs;
    c.max_batch_tokens = max_batch_tokens;
    c.queue_capacity = queue;
    berth_engine *e = NULL;
    ck_assert_msg(berth_engine_create(&c, &e) == BERTH_OK, "%s", berth_engine_last_error());
    return e;
}

static berth_engine *make_engine(int32_t max_seqs, int32_t queue) { return make_engine_tokens(max_seqs, queue, 8); }

static berth_engine_request greedy(const struct g4_prompt *p, int32_t max_new)
{
    berth_engine_request rq;
    memset(&rq, 0, sizeof rq);
    rq.struct_size = sizeof rq;
    rq.prompt = p->ids;
    rq.n_prompt = p->n;
    rq.max_new_tokens = max_new;
    rq.ignore_eos = 1;
    return rq;
}

START_TEST(test_concurrent_equals_alone)
{
    struct g4_fixture f;
    g4_load_fixture(fixture_dir, &f);
    berth_engine *e = make_engine(4, 16);
    struct sink alone, together;
    int nr = f.n_prompts < 4 ? f.n_prompts : 4;
    sink_init(&alone, e, 1);
    for (int i = 0; i < nr; i++) {
        berth_engine_request rq = greedy(&f.prompts[i], GEN);
        int64_t id;
        ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &alone, &id), BERTH_OK);
        ck_assert_int_eq(id, 1 + i);
        wait_done(&alone, i + 1);
    }
    sink_init(&together, e, 1 + nr);
    for (int i = 0; i < nr; i++) {
        berth_engine_request rq = greedy(&f.prompts[i], GEN);
        ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &together, NULL), BERTH_OK);
    }
    wait_done(&together, nr);
    for (int i = 0; i < nr; i++) {
        ck_assert_str_eq(together.finish[i][0], "length");
        ck_assert_int_eq(together.n[i][0], GEN);
        ck_assert_int_eq(memcmp(together.toks[i][0], alone.toks[i][0], GEN * sizeof(int32_t)), 0);
    }
    berth_engine_stats st;
    st.struct_size = sizeof st;
    ck_assert_int_eq(berth_engine_get_stats(e, &st), BERTH_OK);
    ck_assert_int_eq(st.finished, 2 * nr);
    ck_assert_int_gt(st.cached_tokens, 0); /* the second round found the first round's prompts */
    ck_assert_int_gt(st.n_pools, 0);

    /* stop ids: stop at the third greedy token */
    struct sink stop;
    sink_init(&stop, e, 1 + 2 * nr);
    berth_engine_request rq = greedy(&f.prompts[0], GEN);
    int32_t stop_id = alone.toks[0][0][2];
    rq.stop_ids = &stop_id;
    rq.n_stop_ids = 1;
    ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &stop, NULL), BERTH_OK);
    wait_done(&stop, 1);
    ck_assert_str_eq(stop.finish[0][0], "stop");
    ck_assert_int_le(stop.n[0][0], 3);
    ck_assert_int_eq(stop.toks[0][0][stop.n[0][0] - 1], stop_id);

    /* n = 4: four samples, three forks */
    struct sink four;
    sink_init(&four, e, 2 + 2 * nr);
    rq = greedy(&f.prompts[0], GEN);
    rq.n = 4;
    rq.temperature = 0.8f;
    rq.seed = 3;
    ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &four, NULL), BERTH_OK);
    wait_done(&four, 4);
    for (int k = 0; k < 4; k++) ck_assert_int_eq(four.n[0][k], GEN);
    ck_assert_int_eq(berth_engine_get_stats(e, &st), BERTH_OK);
    ck_assert_int_eq(st.forks, 3);
    /* bad requests fail at submit */
    int32_t bad = f.vocab;
    rq = greedy(&f.prompts[0], GEN);
    rq.prompt = &bad;
    rq.n_prompt = 1;
    ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &four, NULL), BERTH_E_INVALID);
    ck_assert_ptr_nonnull(strstr(berth_engine_last_error(), "outside the vocabulary"));
    berth_engine_destroy(e);
    sink_fini(&alone);
    sink_fini(&together);
    sink_fini(&stop);
    sink_fini(&four);
    g4_free_fixture(&f);
}
END_TEST

START_TEST(test_overload_and_cancel)
{
    struct g4_fixture f;
    g4_load_fixture(fixture_dir, &f);
    berth_engine *e = make_engine(2, 2);
    struct sink s;
    sink_init(&s, e, 1);
    s.gate_closed = 1;
    berth_engine_request rq = greedy(&f.prompts[0], 40);
    ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &s, NULL), BERTH_OK);
    wait_at_gate(&s); /* request 1 has its first token; the engine thread is held */
    ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &s, NULL), BERTH_OK);
    int64_t id = 0;
    ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &s, &id), BERTH_E_OVERLOADED);
    ck_assert_int_eq(id, -1);
    ck_assert_str_eq(berth_engine_last_error(),
                     "engine overloaded: 2 requests are queued or running (the queue holds 2); retry later");
    berth_engine_stats st;
    st.struct_size = sizeof st;
    ck_assert_int_eq(berth_engine_get_stats(e, &st), BERTH_OK);
    ck_assert_int_eq(st.rejected, 1);
    ck_assert_int_gt(st.blocks_in_use[st.n_pools - 1], 0);
    /* Cancel both while the engine is held; DONE "cancelled" arrives with no KV block in use. */
    ck_assert_int_eq(berth_engine_cancel(e, 1), BERTH_OK);
    ck_assert_int_eq(berth_engine_cancel(e, 2), BERTH_OK);
    ck_assert_int_eq(berth_engine_cancel(e, 77), BERTH_E_NOT_FOUND);
    ck_assert_str_eq(berth_engine_last_error(), "no live request has id 77");
    open_gate(&s);
    wait_done(&s, 2);
    ck_assert_str_eq(s.finish[0][0], "cancelled");
    ck_assert_str_eq(s.finish[1][0], "cancelled");
    ck_assert_int_lt(s.done_tokens[0][0], 40);
    ck_assert_int_eq(s.blocks_in_use_at_done, 0);
    /* Room again. */
    ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &s, &id), BERTH_OK);
    ck_assert_int_eq(id, 3);
    berth_engine_destroy(e); /* cancels request 3 if still running: DONE arrives before destroy returns */
    ck_assert_int_eq(s.n_done, 3);
    sink_fini(&s);
    g4_free_fixture(&f);
}
END_TEST

/* Submissions made while the engine is held start together: one prefill step for all of them, then one decode
 * step per further token (no mixed step). A held request can be cancelled; the engine does not step meanwhile. */
START_TEST(test_hold_starts_together)
{
    struct g4_fixture f;
    g4_load_fixture(fixture_dir, &f);
    int nr = f.n_prompts < 3 ? f.n_prompts : 3;
    int32_t total = 0;
    for (int i = 0; i < nr; i++) total += f.prompts[i].n;
    berth_engine *e = make_engine_tokens(4, 8, total);
    struct sink s;
    sink_init(&s, e, 1);
    berth_engine_hold(e, 1);
    for (int i = 0; i < nr; i++) {
        berth_engine_request rq = greedy(&f.prompts[i], GEN);
        ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &s, NULL), BERTH_OK);
        /* time for an engine that ignored the hold to start the first request alone (a tiny step takes ~1 ms) */
        if (i == 0) usleep(200 * 1000);
    }
    berth_engine_request rq = greedy(&f.prompts[0], GEN);
    int64_t held = 0;
    ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &s, &held), BERTH_OK);
    ck_assert_int_eq(held, 1 + nr);
    ck_assert_int_eq(berth_engine_cancel(e, held), BERTH_OK);
    wait_done(&s, 1);
    ck_assert_str_eq(s.finish[nr][0], "cancelled");
    ck_assert_int_eq(s.done_tokens[nr][0], 0);
    berth_engine_stats st;
    st.struct_size = sizeof st;
    ck_assert_int_eq(berth_engine_get_stats(e, &st), BERTH_OK);
    ck_assert_int_eq(st.steps, 0);
    for (int i = 0; i < nr; i++) ck_assert_int_eq(s.n[i][0], 0);
    berth_engine_hold(e, 0);
    wait_done(&s, 1 + nr);
    ck_assert_int_eq(berth_engine_get_stats(e, &st), BERTH_OK);
    for (int i = 0; i < nr; i++) {
        ck_assert_str_eq(s.finish[i][0], "length");
        ck_assert_int_eq(s.n[i][0], GEN);
    }
    ck_assert_int_eq(st.steps, GEN);
    ck_assert_int_eq(st.mixed_steps, 0);
    ck_assert_int_eq(st.prefill_tokens, total);
    berth_engine_destroy(e);
    sink_fini(&s);
    g4_free_fixture(&f);
}
END_TEST

START_TEST(test_create_errors)
{
    berth_engine_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.config_path = cfg_path;
    c.model_dir = fixture_dir;
    c.kv_memory = 1ull << 62;
    berth_engine *e = NULL;
    berth_status st = berth_engine_create(&c, &e);
    ck_assert_int_ne(st, BERTH_OK);
    ck_assert_ptr_null(e);
    ck_assert_msg(strstr(berth_engine_last_error(), "[kv] memory = 4611686018427387904 bytes") != NULL, "%s",
                  berth_engine_last_error());
    c.config_path = NULL;
    ck_assert_int_eq(berth_engine_create(&c, &e), BERTH_E_INVALID);
    ck_assert_str_eq(berth_engine_last_error(), "engine: a config path is required");
}
END_TEST

int main(void)
{
    char **dirs;
    int n = g4_list_fixtures(&dirs);
    if (n == 0) {
        printf("SKIP: no Gemma 4 fixtures\n");
        return 77;
    }
    fixture_dir = strdup(dirs[0]);
    g4_free_list(dirs, n);
    cfg_path = g4_config_path();
    Suite *su = suite_create("engine_api");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_concurrent_equals_alone);
    tcase_add_test(tc, test_overload_and_cancel);
    tcase_add_test(tc, test_hold_starts_together);
    tcase_add_test(tc, test_create_errors);
    suite_add_tcase(su, tc);
    const int failed = check_run(su, 0);
    free(fixture_dir);
    free(cfg_path);
    return failed ? 1 : 0;
}
