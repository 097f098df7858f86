/*
 * Remora's libibverbs from C, in one process: two RC queue pairs of one
 * device connected to each other through the node's own UDP tunnel
 * (REMORA_VERBS="udp A A"), every operation the drop-in supports, the
 * NAKs a bad access earns, and the errno of every refused request.
 *
 * Built against rdma-core's own headers and libibverbs, run with Remora's
 * first on LD_LIBRARY_PATH: an unmodified program. Prints "ok" on success;
 * any failed check prints what and exits 1.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_timedjoin_np */
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHECK(condition, ...)                                              \
	do {                                                                   \
		if (!(condition)) {                                                \
			fprintf(stderr, "line %d: ", __LINE__);                        \
			fprintf(stderr, __VA_ARGS__);                                  \
			fprintf(stderr, " (errno %d)\n", errno);                       \
			exit(1);                                                       \
		}                                                                  \
	} while (0)

enum { BUFFER_BYTES = 8192, MAX_POLLS = 100000000 };

static struct ibv_context *context;
static struct ibv_pd *pd;
static struct ibv_cq *cq;

/* Waits for one completion on `completions`; returns it. */
static struct ibv_wc complete_on(struct ibv_cq *completions)
{
	struct ibv_wc wc;
	for (long polls = 0; polls < MAX_POLLS; polls++) {
		int found = ibv_poll_cq(completions, 1, &wc);
		CHECK(found >= 0, "poll_cq failed");
		if (found == 1)
			return wc;
	}
	CHECK(0, "no completion");
	return wc;
}

/* Waits for one completion on the main CQ; returns it. */
static struct ibv_wc complete(void)
{
	return complete_on(cq);
}

/* Moves `qp` to INIT on port 1, granting peers `access`. */
static void to_init(struct ibv_qp *qp, int access)
{
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = access };
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
	      "to INIT");
}

static struct ibv_qp *make_qp_on(struct ibv_cq *completions)
{
	struct ibv_qp_init_attr init = {
		.send_cq = completions, .recv_cq = completions, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 64 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp, "create_qp");
	CHECK(init.cap.max_inline_data >= 64, "inline capability");
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC };
	/* As a kernel provider: INIT needs the access flags (without, it once
	 * left the QP open to every remote READ, WRITE and atomic). */
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) == EINVAL,
	      "INIT without access flags is refused");
	to_init(qp, attr.qp_access_flags);
	return qp;
}

static struct ibv_qp *make_qp(void)
{
	return make_qp_on(cq);
}

/* To RTS, serving `served` READs and atomics at once (max_dest_rd_atomic). */
static void connect_qp_serving(struct ibv_qp *qp, uint32_t remote_qpn, union ibv_gid gid, uint8_t min_rnr_timer,
			       uint8_t served)
{
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = remote_qpn, .rq_psn = 100, .max_dest_rd_atomic = served, .min_rnr_timer = min_rnr_timer,
		.ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } } };
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
		| IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV) == EINVAL, "RTR without a PSN is refused");
	CHECK(ibv_modify_qp(qp, &attr, mask) == 0, "to RTR");
	attr.qp_state = IBV_QPS_RTS;
	attr.sq_psn = 100;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.max_rd_atomic = 4;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	/* Without a send PSN, the QP kept a random one and failed much later. */
	CHECK(ibv_modify_qp(qp, &attr, mask & ~IBV_QP_SQ_PSN) == EINVAL, "RTS without a send PSN is refused");
	CHECK(ibv_modify_qp(qp, &attr, mask) == 0, "to RTS");
	struct ibv_qp_attr queried;
	struct ibv_qp_init_attr queried_init;
	CHECK(ibv_query_qp(qp, &queried, IBV_QP_STATE, &queried_init) == 0, "query_qp");
	CHECK(queried.qp_state == IBV_QPS_RTS && queried.dest_qp_num == remote_qpn, "queried state");
}

static void connect_qp_with(struct ibv_qp *qp, uint32_t remote_qpn, union ibv_gid gid, uint8_t min_rnr_timer)
{
	connect_qp_serving(qp, remote_qpn, gid, min_rnr_timer, 4);
}

static void connect_qp(struct ibv_qp *qp, uint32_t remote_qpn, union ibv_gid gid)
{
	connect_qp_with(qp, remote_qpn, gid, 12);
}

static struct ibv_wc post_one(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(qp, wr, &bad) == 0, "post_send opcode %d", wr->opcode);
	return complete();
}

static void refusals(void)
{
	struct ibv_qp_init_attr ud = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	errno = 0;
	CHECK(ibv_create_qp(pd, &ud) == NULL && errno == EOPNOTSUPP, "a UD QP is refused with EOPNOTSUPP");
	char page[64];
	errno = 0;
	CHECK(ibv_reg_mr(pd, page, sizeof page, IBV_ACCESS_ON_DEMAND) == NULL && errno == EOPNOTSUPP,
	      "on-demand paging is refused with EOPNOTSUPP");
	errno = 0;
	CHECK(ibv_reg_mr(pd, (void *)(uintptr_t)-4096, 8192, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EFAULT,
	      "a range past the address space is refused with EFAULT");
	/* A peer's 8-byte-aligned atomic would land on a misaligned word. */
	uint64_t words[4];
	errno = 0;
	CHECK(ibv_reg_mr_iova(pd, (char *)words + 4, 16, 0x10000,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC) == NULL && errno == EINVAL,
	      "remote atomics on an IOVA misaligned with its memory are EINVAL");
	errno = 0;
	CHECK(ibv_create_cq(context, 0, NULL, NULL, 0) == NULL && errno == EINVAL, "a CQ of 0 entries is EINVAL");
	/* Memory that is not mapped, or not writable where the device may write,
	 * is refused as the kernel's pinning refuses it (it faulted later, in
	 * the progress thread). */
	errno = 0;
	CHECK(ibv_reg_mr(pd, (void *)(uintptr_t)0x1000, 4096, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EFAULT,
	      "an unmapped range is EFAULT");
	void *read_only = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(read_only != MAP_FAILED, "mmap");
	errno = 0;
	CHECK(ibv_reg_mr(pd, read_only, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == NULL
		      && errno == EFAULT,
	      "a read-only page registered for writes is EFAULT");
	struct ibv_mr *readable = ibv_reg_mr(pd, read_only, 4096, IBV_ACCESS_REMOTE_READ);
	CHECK(readable && ibv_dereg_mr(readable) == 0, "a read-only page registered for remote reads");
	munmap(read_only, 4096);
	struct ibv_cq_init_attr_ex cq_ex = { .cqe = 4 };
	errno = 0;
	CHECK(ibv_create_cq_ex(context, &cq_ex) == NULL && errno == EOPNOTSUPP, "create_cq_ex is EOPNOTSUPP");
	/* Arming a CQ with no channel is legal (mlx5, rxe): programs arm unconditionally. */
	struct ibv_cq *plain = ibv_create_cq(context, 4, NULL, NULL, 0);
	CHECK(plain && ibv_req_notify_cq(plain, 0) == 0, "arming a CQ without a channel is 0");
	CHECK(ibv_destroy_cq(plain) == 0, "destroy the plain CQ");
	/* Sized as mlx5 sizes it: a power of two less one, within max_cqe. */
	struct ibv_device_attr limits;
	CHECK(ibv_query_device(context, &limits) == 0, "query_device");
	struct ibv_cq *sized = ibv_create_cq(context, 100, NULL, NULL, 0);
	CHECK(sized && sized->cqe == 127, "a CQ asked for 100 entries holds 127 (%d)", sized ? sized->cqe : -1);
	CHECK(ibv_destroy_cq(sized) == 0, "destroy the sized CQ");
	sized = ibv_create_cq(context, limits.max_cqe, NULL, NULL, 0);
	CHECK(sized && sized->cqe == limits.max_cqe, "a CQ of max_cqe entries holds max_cqe");
	CHECK(ibv_destroy_cq(sized) == 0, "destroy the largest CQ");
	union ibv_gid gid;
	CHECK(ibv_query_gid(context, 1, 1, &gid) != 0, "GID index 1 does not exist");
	struct ibv_port_attr port;
	CHECK(ibv_query_port(context, 2, &port) != 0, "port 2 does not exist");
}

/* A destroyed CQ's pending event is dropped, as the kernel drops it: the
 * program is never handed a queue it destroyed. */
/* A server that makes a CQ, an SRQ and a QP per connection and destroys
 * them when it closes: three times the device's limit of each, in turn.
 * The device kept every destroyed one's place, so the 1025th failed. */
static void many_lifetimes(void)
{
	struct ibv_device_attr device;
	CHECK(ibv_query_device(context, &device) == 0, "query_device");
	uint32_t last_qpn = 0;
	for (int round = 0; round < 3 * device.max_qp; round++) {
		struct ibv_cq *each = ibv_create_cq(context, 4, NULL, NULL, 0);
		CHECK(each, "create_cq in round %d", round);
		struct ibv_srq_init_attr srq_init = { .attr = { .max_wr = 4, .max_sge = 1 } };
		struct ibv_srq *srq = ibv_create_srq(pd, &srq_init);
		CHECK(srq, "create_srq in round %d", round);
		struct ibv_qp *qp = make_qp_on(each);
		CHECK(qp->qp_num != last_qpn, "a reused slot takes a new number");
		last_qpn = qp->qp_num;
		CHECK(ibv_destroy_cq(each) == EBUSY, "a CQ in use stays");
		CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp in round %d", round);
		CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq in round %d", round);
		CHECK(ibv_destroy_cq(each) == 0, "destroy_cq in round %d", round);
	}
}

static void destroyed_queue_events(union ibv_gid gid, uint8_t *local, struct ibv_mr *local_mr,
				   uint8_t *remote, struct ibv_mr *remote_mr)
{
	struct ibv_comp_channel *channel = ibv_create_comp_channel(context);
	CHECK(channel, "create_comp_channel");
	struct ibv_cq *evented = ibv_create_cq(context, 8, NULL, channel, 0);
	struct ibv_cq *other = ibv_create_cq(context, 8, NULL, channel, 0);
	CHECK(evented && other, "two CQs on one channel");
	CHECK(ibv_destroy_comp_channel(channel) == EBUSY, "a channel with CQs is busy");
	struct ibv_qp *c = make_qp_on(evented), *d = make_qp_on(evented);
	connect_qp(c, d->qp_num, gid);
	connect_qp(d, c->qp_num, gid);
	CHECK(ibv_req_notify_cq(evented, 0) == 0, "arm");
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 8, .lkey = local_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)remote, .rkey = remote_mr->rkey } }, *bad = NULL;
	CHECK(ibv_post_send(c, &wr, &bad) == 0, "post on the armed queue's QP");
	struct pollfd readable = { .fd = channel->fd, .events = POLLIN };
	CHECK(poll(&readable, 1, 5000) == 1, "the completion raised an event");
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(evented, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "the WRITE completed");
	CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(d) == 0, "destroy the QPs");
	CHECK(ibv_destroy_cq(evented) == 0, "destroy the armed CQ with its event pending");
	/* Its event went with it: counted still, the descriptor stayed
	 * readable, and a blocking ibv_get_cq_event then waited for ever. */
	CHECK(poll(&readable, 1, 0) == 0, "the channel is not readable for a destroyed CQ's event");
	CHECK(fcntl(channel->fd, F_SETFL, fcntl(channel->fd, F_GETFL) | O_NONBLOCK) == 0, "non-blocking");
	struct ibv_cq *named = NULL;
	void *cq_context = NULL;
	errno = 0;
	CHECK(ibv_get_cq_event(channel, &named, &cq_context) == -1 && errno == EAGAIN,
	      "no event names the destroyed CQ (got %p)", (void *)named);
	CHECK(ibv_destroy_cq(other) == 0, "destroy the other CQ");
	CHECK(ibv_destroy_comp_channel(channel) == 0, "an unused channel is destroyed");
}

/* ibv_req_notify_cq(cq, 1) ignored solicited_only: any completion raised
 * the event, and IBV_SEND_SOLICITED never reached the wire. Armed for
 * solicited completions only, an unsolicited receive leaves the channel
 * quiet, and a solicited one raises its event. */
static void solicited_only_waits_for_a_solicited_receive(union ibv_gid gid, uint8_t *local,
							 struct ibv_mr *local_mr, uint8_t *remote,
							 struct ibv_mr *remote_mr)
{
	struct ibv_comp_channel *channel = ibv_create_comp_channel(context);
	CHECK(channel, "create_comp_channel");
	struct ibv_cq *evented = ibv_create_cq(context, 8, NULL, channel, 0);
	CHECK(evented, "an evented CQ");
	struct ibv_qp *sender = make_qp_on(cq), *receiver = make_qp_on(evented);
	connect_qp(sender, receiver->qp_num, gid);
	connect_qp(receiver, sender->qp_num, gid);
	for (uint64_t id = 1; id <= 2; id++) {
		struct ibv_sge receive_sge = { .addr = (uintptr_t)remote + 64 * id, .length = 64,
			.lkey = remote_mr->lkey };
		struct ibv_recv_wr receive = { .wr_id = id, .sg_list = &receive_sge, .num_sge = 1 }, *bad;
		CHECK(ibv_post_recv(receiver, &receive, &bad) == 0, "post receive %d", (int)id);
	}
	CHECK(ibv_req_notify_cq(evented, 1) == 0, "arm for solicited completions");
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 8, .lkey = local_mr->lkey };
	struct ibv_send_wr send = { .wr_id = 30, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	struct ibv_wc wc = post_one(sender, &send);
	CHECK(wc.status == IBV_WC_SUCCESS, "the unsolicited SEND");
	wc = complete_on(evented);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1, "the unsolicited receive completed");
	struct pollfd readable = { .fd = channel->fd, .events = POLLIN };
	CHECK(poll(&readable, 1, 0) == 0, "an unsolicited receive raised no event");
	send.send_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
	CHECK(ibv_post_send(sender, &send, &bad) == 0, "post the solicited SEND");
	CHECK(poll(&readable, 1, 5000) == 1, "the solicited receive raised the event");
	struct ibv_cq *named = NULL;
	void *cq_context = NULL;
	CHECK(ibv_get_cq_event(channel, &named, &cq_context) == 0 && named == evented, "the event names the CQ");
	ibv_ack_cq_events(evented, 1);
	wc = complete_on(evented);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 2, "the solicited receive completed");
	wc = complete();
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 30, "the solicited SEND completed");
	CHECK(ibv_destroy_qp(sender) == 0 && ibv_destroy_qp(receiver) == 0, "destroy the QPs");
	CHECK(ibv_destroy_cq(evented) == 0, "destroy the evented CQ");
	CHECK(ibv_destroy_comp_channel(channel) == 0, "destroy the channel");
}

/* IBV_SEND_FENCE was ignored: a SEND of the buffer a READ fills went out
 * before the READ's answer, with the buffer's old bytes. Fenced, it waits
 * for the READ and carries what the READ brought. */
static void a_fenced_send_carries_what_its_read_brought(union ibv_gid gid, uint8_t *local,
							struct ibv_mr *local_mr, uint8_t *remote,
							struct ibv_mr *remote_mr)
{
	struct ibv_qp *a = make_qp(), *b = make_qp();
	connect_qp(a, b->qp_num, gid);
	connect_qp(b, a->qp_num, gid);
	uint8_t *source = remote + 1024, *landing = remote + 2048, *buffer = local + 1024;
	memset(source, 0x5a, 256);
	memset(landing, 0, 256);
	memset(buffer, 0xee, 256);
	struct ibv_sge receive_sge = { .addr = (uintptr_t)landing, .length = 256, .lkey = remote_mr->lkey };
	struct ibv_recv_wr receive = { .wr_id = 40, .sg_list = &receive_sge, .num_sge = 1 }, *bad_receive;
	CHECK(ibv_post_recv(b, &receive, &bad_receive) == 0, "post the receive");
	struct ibv_sge sge = { .addr = (uintptr_t)buffer, .length = 256, .lkey = local_mr->lkey };
	struct ibv_send_wr send = { .wr_id = 42, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE };
	struct ibv_send_wr read = { .wr_id = 41, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED, .next = &send,
		.wr.rdma = { .remote_addr = (uintptr_t)source, .rkey = remote_mr->rkey } }, *bad = NULL;
	CHECK(ibv_post_send(a, &read, &bad) == 0, "post the READ and the fenced SEND");
	for (int i = 0; i < 3; i++) {
		struct ibv_wc wc = complete();
		CHECK(wc.status == IBV_WC_SUCCESS, "completion %d status %s", i, ibv_wc_status_str(wc.status));
	}
	for (int i = 0; i < 256; i++)
		CHECK(landing[i] == 0x5a, "byte %d of the fenced SEND is %#x, not the READ's", i, landing[i]);
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy the QPs");
}

/* Moving a QP to the error state flushes its posted receive into the CQ
 * inside the verb: an armed channel hears of it then, with no frame or
 * timer to wake the progress thread (the usual drain before teardown). */
static void a_flush_raises_the_armed_event(uint8_t *remote, struct ibv_mr *remote_mr)
{
	struct ibv_comp_channel *channel = ibv_create_comp_channel(context);
	CHECK(channel, "create_comp_channel");
	struct ibv_cq *evented = ibv_create_cq(context, 8, NULL, channel, 0);
	CHECK(evented, "create an evented CQ");
	struct ibv_qp *qp = make_qp_on(evented);
	struct ibv_sge sge = { .addr = (uintptr_t)remote, .length = 64, .lkey = remote_mr->lkey };
	struct ibv_recv_wr receive = { .wr_id = 77, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
	CHECK(ibv_post_recv(qp, &receive, &bad) == 0, "post a receive to flush");
	CHECK(ibv_req_notify_cq(evented, 0) == 0, "arm");
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0, "to ERR");
	struct pollfd readable = { .fd = channel->fd, .events = POLLIN };
	CHECK(poll(&readable, 1, 5000) == 1, "the flush raised the armed event");
	struct ibv_cq *named = NULL;
	void *cq_context = NULL;
	CHECK(ibv_get_cq_event(channel, &named, &cq_context) == 0 && named == evented, "the event names the CQ");
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(evented, 1, &wc) == 1 && wc.wr_id == 77 && wc.status == IBV_WC_WR_FLUSH_ERR,
	      "the receive was flushed");
	CHECK(ibv_destroy_qp(qp) == 0, "destroy the QP");
	/* An event handed out and not yet acked keeps its CQ: freed, the ack
	 * (from another thread, say) wrote freed memory. */
	CHECK(ibv_req_notify_cq(evented, 0) == 0, "arm again");
	CHECK(ibv_destroy_cq(evented) == EBUSY, "a CQ with an unacked event is busy");
	/* The refusal changed nothing: the CQ stays armed (it was disarmed,
	 * and its queued events dropped, before the refusal). */
	struct ibv_qp *again = make_qp_on(evented);
	CHECK(ibv_post_recv(again, &receive, &bad) == 0, "post another receive to flush");
	CHECK(ibv_modify_qp(again, &attr, IBV_QP_STATE) == 0, "the second QP to ERR");
	CHECK(poll(&readable, 1, 5000) == 1, "a refused destroy left the CQ armed");
	CHECK(ibv_get_cq_event(channel, &named, &cq_context) == 0 && named == evented,
	      "the second event names the CQ");
	CHECK(ibv_poll_cq(evented, 1, &wc) == 1 && wc.wr_id == 77, "the second receive was flushed");
	CHECK(ibv_destroy_qp(again) == 0, "destroy the second QP");
	ibv_ack_cq_events(evented, 2);
	CHECK(ibv_destroy_cq(evented) == 0, "destroy the CQ once its event is acked");
	CHECK(ibv_destroy_comp_channel(channel) == 0, "destroy the channel");
}

struct event_wait {
	struct ibv_comp_channel *channel;
	struct ibv_cq *named;
	int result, error;
	volatile pid_t thread_id;
};

static void *wait_for_an_event(void *argument)
{
	struct event_wait *wait = argument;
	void *cq_context = NULL;
	wait->thread_id = (pid_t)syscall(SYS_gettid);
	errno = 0;
	wait->result = ibv_get_cq_event(wait->channel, &wait->named, &cq_context);
	wait->error = errno;
	return NULL;
}

static void on_signal(int signal_number)
{
	(void)signal_number;
}

/* Whether thread `thread_id` of this process sleeps in the kernel. */
static int sleeping(pid_t thread_id)
{
	char path[64], stat[512];
	snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)thread_id);
	FILE *file = fopen(path, "r");
	if (!file)
		return 0;
	size_t length = fread(stat, 1, sizeof stat - 1, file);
	fclose(file);
	stat[length] = 0;
	/* The state follows the parenthesised name, which may hold spaces. */
	char *name_end = strrchr(stat, ')');
	return name_end && name_end[1] == ' ' && name_end[2] == 'S';
}

/* A signal ends a blocking ibv_get_cq_event as it ends rdma-core's
 * blocking read. One whose handler has SA_RESTART (perftest's duration
 * alarm) ended it with EINTR, which the read never gives, and which
 * perftest takes as fatal; one whose handler has not, which a program may
 * use to leave the wait, never ended it. With `restart`, the wait goes
 * on to the event; without, it ends with EINTR, and the event waits for
 * the next call. */
static void a_signal_ends_the_wait_for_an_event_as_a_read(uint8_t *remote, struct ibv_mr *remote_mr,
							 int restart)
{
	struct sigaction action = { .sa_handler = on_signal, .sa_flags = restart ? SA_RESTART : 0 };
	sigemptyset(&action.sa_mask);
	CHECK(sigaction(SIGUSR1, &action, NULL) == 0, "install a handler (SA_RESTART %d)", restart);
	struct event_wait wait = { .channel = ibv_create_comp_channel(context) };
	CHECK(wait.channel, "create_comp_channel");
	struct ibv_cq *evented = ibv_create_cq(context, 8, NULL, wait.channel, 0);
	CHECK(evented, "create an evented CQ");
	struct ibv_qp *qp = make_qp_on(evented);
	struct ibv_sge sge = { .addr = (uintptr_t)remote, .length = 64, .lkey = remote_mr->lkey };
	struct ibv_recv_wr receive = { .wr_id = 78, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
	CHECK(ibv_post_recv(qp, &receive, &bad) == 0, "post a receive to flush");
	CHECK(ibv_req_notify_cq(evented, 0) == 0, "arm");
	pthread_t waiter;
	CHECK(pthread_create(&waiter, NULL, wait_for_an_event, &wait) == 0, "start the waiter");
	/* Signalled only once it waits in the kernel, or the signal could
	 * land before the wait and the test pass without testing anything. */
	int waited_ms = 0;
	while (!(wait.thread_id && sleeping(wait.thread_id)) && waited_ms < 5000) {
		usleep(1000);
		waited_ms++;
	}
	CHECK(waited_ms < 5000, "the waiter sleeps in ibv_get_cq_event");
	CHECK(pthread_kill(waiter, SIGUSR1) == 0, "signal the waiter");
	usleep(50000);
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0, "to ERR, which raises the event");
	struct timespec limit;
	clock_gettime(CLOCK_REALTIME, &limit);
	limit.tv_sec += 5;
	CHECK(pthread_timedjoin_np(waiter, NULL, &limit) == 0, "the waiter returns within 5 s");
	if (restart) {
		CHECK(wait.result == 0 && wait.named == evented,
		      "the signal did not end the wait (result %d, errno %d)", wait.result, wait.error);
	} else {
		CHECK(wait.result == -1 && wait.error == EINTR,
		      "the signal ended the wait with EINTR (result %d, errno %d)", wait.result, wait.error);
		void *cq_context = NULL;
		CHECK(ibv_get_cq_event(wait.channel, &wait.named, &cq_context) == 0 && wait.named == evented,
		      "the event waits for the next call");
	}
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(evented, 1, &wc) == 1 && wc.wr_id == 78, "the receive was flushed");
	ibv_ack_cq_events(evented, 1);
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_cq(evented) == 0, "destroy");
	CHECK(ibv_destroy_comp_channel(wait.channel) == 0, "destroy the channel");
	signal(SIGUSR1, SIG_DFL);
}

/* Destroying a QP takes its work with it: its posted receives complete
 * nowhere (a flush put them in a CQ shared with live QPs, carrying wr_ids
 * the program had freed), and a live QP on that CQ goes on. */
static void a_destroyed_qp_leaves_no_completions(uint8_t *remote, struct ibv_mr *remote_mr)
{
	struct ibv_cq *shared = ibv_create_cq(context, 4, NULL, NULL, 0);
	CHECK(shared, "create a small shared CQ");
	struct ibv_qp *live = make_qp_on(shared), *doomed = make_qp_on(shared);
	struct ibv_sge sge = { .addr = (uintptr_t)remote, .length = 64, .lkey = remote_mr->lkey };
	struct ibv_recv_wr receive = { .wr_id = 90, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
	for (int i = 0; i < 4; i++)
		CHECK(ibv_post_recv(doomed, &receive, &bad) == 0, "post receive %d on the doomed QP", i);
	CHECK(ibv_post_recv(live, &receive, &bad) == 0, "post a receive on the live QP");
	CHECK(ibv_destroy_qp(doomed) == 0, "destroy the QP with its receives posted");
	struct ibv_wc wc[8];
	CHECK(ibv_poll_cq(shared, 8, wc) == 0, "no completion of the destroyed QP");
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK(ibv_query_qp(live, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state != IBV_QPS_ERR,
	      "the live QP is not in error");
	CHECK(ibv_destroy_qp(live) == 0 && ibv_destroy_cq(shared) == 0, "destroy");
}

/* A QP's qp_access_flags bound what peers may do through it, whatever the
 * key: they were kept and never applied, so a QP brought up for SEND and
 * RECV alone took any peer's WRITE into any region of its PD. */
static void a_qps_access_flags_bound_its_peers(union ibv_gid gid, uint8_t *local, struct ibv_mr *local_mr,
					       uint8_t *remote, struct ibv_mr *remote_mr)
{
	struct ibv_qp *writer = make_qp(), *reader_only = make_qp();
	struct ibv_qp_attr attr = { .qp_access_flags = IBV_ACCESS_REMOTE_READ };
	CHECK(ibv_modify_qp(reader_only, &attr, IBV_QP_ACCESS_FLAGS) == 0, "INIT with remote reads only");
	connect_qp(writer, reader_only->qp_num, gid);
	connect_qp(reader_only, writer->qp_num, gid);
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 64, .lkey = local_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 60, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)remote, .rkey = remote_mr->rkey } };
	/* RTS to RTS changes a live QP's attributes (it was EINVAL). */
	struct ibv_qp_attr again = { .qp_state = IBV_QPS_RTS, .min_rnr_timer = 12 };
	CHECK(ibv_modify_qp(writer, &again, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER) == 0, "RTS to RTS");
	struct ibv_wc wc = post_one(writer, &wr);
	CHECK(wc.status == IBV_WC_SUCCESS, "a READ the QP allows completes");
	wr.wr_id = 61;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wc = post_one(writer, &wr);
	/* An operation the receive queue does not support is an Invalid
	 * Request NAK in the IBA's words, as the kernel's soft RoCE answers;
	 * a Remote Access Error blames the region and its key. */
	CHECK(wc.status == IBV_WC_REM_INV_REQ_ERR, "a WRITE the QP does not allow is a remote invalid request, not %s",
	      ibv_wc_status_str(wc.status));
	CHECK(ibv_destroy_qp(writer) == 0 && ibv_destroy_qp(reader_only) == 0, "destroy");
}

/* rnr_retry reaches the device: with 0, a SEND to a peer with no receive
 * posted fails at its first RNR NAK (it was retried for ever, a hang for
 * a program waiting on the completion). */
static void rnr_retry_zero_gives_up_at_once(union ibv_gid gid, uint8_t *local, struct ibv_mr *local_mr)
{
	struct ibv_qp *sender = make_qp(), *idle = make_qp();
	connect_qp(sender, idle->qp_num, gid);
	connect_qp(idle, sender->qp_num, gid);
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RTS, .rnr_retry = 0 };
	CHECK(ibv_modify_qp(sender, &attr, IBV_QP_STATE | IBV_QP_RNR_RETRY) == 0, "rnr_retry 0");
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 16, .lkey = local_mr->lkey };
	struct ibv_send_wr send = { .wr_id = 70, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED };
	struct ibv_wc wc = post_one(sender, &send);
	CHECK(wc.wr_id == 70 && wc.status == IBV_WC_RNR_RETRY_EXC_ERR, "the SEND gave up on RNR, not %s",
	      ibv_wc_status_str(wc.status));
	/* ibv_query_qp(3) with IBV_QP_STATE refreshes qp->state, as
	 * rdma-core's does: it stayed RTS after the move to ERR. */
	struct ibv_qp_init_attr init;
	CHECK(ibv_query_qp(sender, &attr, IBV_QP_STATE, &init) == 0, "query_qp");
	CHECK(attr.qp_state == IBV_QPS_ERR && sender->state == IBV_QPS_ERR,
	      "the failed QP is in ERR (query %d, qp->state %d)", attr.qp_state, sender->state);
	CHECK(ibv_destroy_qp(sender) == 0 && ibv_destroy_qp(idle) == 0, "destroy");
}

static double seconds_now(void)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec + now.tv_nsec / 1e9;
}

/* A bad lkey failed the post with EINVAL; mlx5 takes the post and
 * completes the request with IBV_WC_LOC_PROT_ERR, the QP then in ERR and
 * the requests after it flushed, which programs and test suites expect. */
static void a_bad_lkey_completes_with_a_local_protection_error(union ibv_gid gid, uint8_t *local,
								struct ibv_mr *local_mr, uint8_t *remote,
								struct ibv_mr *remote_mr)
{
	struct ibv_qp *sender = make_qp(), *peer = make_qp();
	connect_qp(sender, peer->qp_num, gid);
	connect_qp(peer, sender->qp_num, gid);
	struct ibv_sge bad = { .addr = (uintptr_t)local, .length = 16, .lkey = local_mr->lkey ^ 0x5a5a00 };
	struct ibv_sge good = { .addr = (uintptr_t)local, .length = 16, .lkey = local_mr->lkey };
	struct ibv_send_wr after = { .wr_id = 82, .sg_list = &good, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)remote, .rkey = remote_mr->rkey } };
	struct ibv_send_wr faulty = after;
	faulty.wr_id = 81;
	faulty.sg_list = &bad;
	faulty.next = &after;
	struct ibv_send_wr *bad_wr = NULL;
	CHECK(ibv_post_send(sender, &faulty, &bad_wr) == 0 && bad_wr == NULL,
	      "the post with a bad lkey is taken, as on mlx5");
	struct ibv_wc wc[2];
	int taken = 0;
	double deadline = seconds_now() + 5;
	while (taken < 2 && seconds_now() < deadline) {
		int polled = ibv_poll_cq(cq, 2 - taken, wc + taken);
		CHECK(polled >= 0, "poll_cq");
		taken += polled;
	}
	CHECK(taken == 2, "two completions, not %d", taken);
	CHECK(wc[0].wr_id == 81 && wc[0].status == IBV_WC_LOC_PROT_ERR, "the bad lkey's request: %s",
	      ibv_wc_status_str(wc[0].status));
	CHECK(wc[1].wr_id == 82 && wc[1].status == IBV_WC_WR_FLUSH_ERR, "the request after it is flushed: %s",
	      ibv_wc_status_str(wc[1].status));
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK(ibv_query_qp(sender, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_ERR,
	      "the QP is in ERR");
	CHECK(ibv_destroy_qp(sender) == 0 && ibv_destroy_qp(peer) == 0, "destroy");
}

/* modify_qp's path MTU, READ and atomic limits and RNR timer were kept for
 * query_qp and never reached the device: its RNR NAKs asked for 20 us
 * whatever min_rnr_timer said, and no value was checked. */
static void path_attributes_are_checked_and_applied(union ibv_gid gid, uint8_t *local, struct ibv_mr *local_mr)
{
	struct ibv_qp *sender = make_qp(), *idle = make_qp();
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = idle->qp_num,
		.rq_psn = 100, .max_dest_rd_atomic = 17, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } } };
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
		| IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK(ibv_modify_qp(sender, &attr, mask) == EINVAL, "max_dest_rd_atomic past max_qp_rd_atom is EINVAL");
	attr.max_dest_rd_atomic = 4;
	attr.path_mtu = 6;
	CHECK(ibv_modify_qp(sender, &attr, mask) == EINVAL, "a path MTU that is no ibv_mtu is EINVAL");
	attr.path_mtu = IBV_MTU_1024;
	attr.min_rnr_timer = 32;
	CHECK(ibv_modify_qp(sender, &attr, mask) == EINVAL, "an RNR timer past 5 bits is EINVAL");
	struct ibv_qp_init_attr init;
	CHECK(ibv_query_qp(sender, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_INIT,
	      "refused moves left the QP in INIT");
	/* The idle side's NAKs ask for 327.68 ms (code 30). */
	connect_qp_with(sender, idle->qp_num, gid, 12);
	connect_qp_with(idle, sender->qp_num, gid, 30);
	attr.qp_state = IBV_QPS_RTS;
	attr.rnr_retry = 1;
	CHECK(ibv_modify_qp(sender, &attr, IBV_QP_STATE | IBV_QP_RNR_RETRY) == 0, "rnr_retry 1");
	attr.path_mtu = IBV_MTU_2048;
	CHECK(ibv_modify_qp(sender, &attr, IBV_QP_PATH_MTU) == EINVAL, "the path MTU is fixed in RTS");
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 16, .lkey = local_mr->lkey };
	struct ibv_send_wr send = { .wr_id = 71, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED };
	double started = seconds_now();
	struct ibv_wc wc = post_one(sender, &send);
	double waited = seconds_now() - started;
	CHECK(wc.wr_id == 71 && wc.status == IBV_WC_RNR_RETRY_EXC_ERR, "the SEND gave up on RNR, not %s",
	      ibv_wc_status_str(wc.status));
	/* The NAK's wait (327.68 ms) then the retransmission timer's 67 ms, at
	 * which a spent budget fails; without the receiver's timer, 67 ms. */
	CHECK(waited >= 0.3, "the retry waited the receiver's min_rnr_timer: %.6f s", waited);
	CHECK(ibv_destroy_qp(sender) == 0 && ibv_destroy_qp(idle) == 0, "destroy");
}

/* A QP whose max_dest_rd_atomic is 0 serves no READs or atomics: a
 * peer's READ is refused (IBV_WC_REM_INV_REQ_ERR). The 0 was taken as 1,
 * and the READ served. */
static void a_qp_serving_no_reads_refuses_them(union ibv_gid gid, uint8_t *local, struct ibv_mr *local_mr,
					       uint8_t *remote, struct ibv_mr *remote_mr)
{
	struct ibv_qp *reader = make_qp(), *server = make_qp();
	connect_qp(reader, server->qp_num, gid);
	connect_qp_serving(server, reader->qp_num, gid, 12, 0);
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK(ibv_query_qp(server, &attr, IBV_QP_MAX_DEST_RD_ATOMIC, &init) == 0 && attr.max_dest_rd_atomic == 0,
	      "the server's limit reads back 0, not %d", attr.max_dest_rd_atomic);
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 16, .lkey = local_mr->lkey };
	struct ibv_send_wr read = { .wr_id = 91, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)remote, .rkey = remote_mr->rkey } };
	struct ibv_wc wc = post_one(reader, &read);
	CHECK(wc.wr_id == 91 && wc.status == IBV_WC_REM_INV_REQ_ERR, "the READ is refused, not %s",
	      ibv_wc_status_str(wc.status));
	CHECK(ibv_destroy_qp(reader) == 0 && ibv_destroy_qp(server) == 0, "destroy");
}

/* Inline sends past a full send queue: a refused one must not overwrite
 * the staging slot of one still in flight. */
static void a_refused_inline_send_leaves_the_others_alone(union ibv_gid gid, uint8_t *remote,
							   struct ibv_mr *remote_mr)
{
	struct ibv_qp_init_attr init = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 64 },
	};
	struct ibv_qp *e = ibv_create_qp(pd, &init), *f = make_qp();
	CHECK(e && init.cap.max_send_wr == 2, "a QP of two send slots");
	to_init(e, IBV_ACCESS_REMOTE_WRITE);
	connect_qp(e, f->qp_num, gid);
	connect_qp(f, e->qp_num, gid);
	char payloads[3][16] = { "first payload", "second payload", "third payload" };
	struct ibv_sge sges[3];
	struct ibv_send_wr wrs[3];
	for (int i = 0; i < 3; i++) {
		sges[i] = (struct ibv_sge){ .addr = (uintptr_t)payloads[i], .length = 16 };
		wrs[i] = (struct ibv_send_wr){ .wr_id = 20 + i, .sg_list = &sges[i], .num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
			.next = i < 2 ? &wrs[i + 1] : NULL,
			.wr.rdma = { .remote_addr = (uintptr_t)remote + 64 * i, .rkey = remote_mr->rkey } };
	}
	memset(remote, 0, 3 * 64);
	struct ibv_send_wr *bad = NULL;
	/* The progress thread may free a slot between the posts: the third is
	 * either refused with ENOMEM or taken. Whichever, every WRITE taken
	 * lands its own bytes. */
	int posted = ibv_post_send(e, wrs, &bad);
	int taken = posted == 0 ? 3 : 2;
	CHECK(posted == 0 || (posted == ENOMEM && bad == &wrs[2]), "posted %d, request %d", posted,
	      bad ? (int)(bad - wrs) : -1);
	for (int i = 0; i < taken; i++) {
		struct ibv_wc wc = complete();
		CHECK(wc.status == IBV_WC_SUCCESS, "inline WRITE %d", i);
	}
	for (int i = 0; i < taken; i++)
		CHECK(memcmp(remote + 64 * i, payloads[i], 16) == 0, "WRITE %d landed its own bytes", i);
	CHECK(ibv_destroy_qp(e) == 0 && ibv_destroy_qp(f) == 0, "destroy the QPs");
}

/* Two connected QPs through the extended creation call, with the work
 * request builder of ibv_wr_post(3). */
static void make_builder_pair(union ibv_gid gid, uint32_t send_depth, struct ibv_qp **builder,
			      struct ibv_qp **peer)
{
	struct ibv_qp_init_attr_ex init = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ,
		.cap = { .max_send_wr = send_depth, .max_recv_wr = 2, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 64 },
	};
	*builder = ibv_create_qp_ex(context, &init);
	CHECK(*builder, "create_qp_ex");
	to_init(*builder, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	*peer = make_qp();
	connect_qp(*builder, (*peer)->qp_num, gid);
	connect_qp(*peer, (*builder)->qp_num, gid);
}

/* No completion arrives for a while. */
static void no_completion(const char *what)
{
	struct ibv_wc wc;
	for (long polls = 0; polls < 2000000; polls++)
		CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "%s: a completion (wr_id %lu)", what,
		      (unsigned long)wc.wr_id);
}

/* ibv_wr_complete posts the whole batch or nothing: three WRITEs on a
 * send queue of two were refused with ENOMEM after the first two were
 * posted, and they ran though the program was told the batch failed. */
static void a_refused_batch_posts_nothing(union ibv_gid gid, uint8_t *remote, struct ibv_mr *remote_mr)
{
	struct ibv_qp *qp, *peer;
	make_builder_pair(gid, 2, &qp, &peer);
	struct ibv_qp_ex *builder = ibv_qp_to_qp_ex(qp);
	CHECK(builder, "qp_to_qp_ex");
	char payload[16] = "batched";
	memset(remote, 0, 3 * 64);
	ibv_wr_start(builder);
	for (int i = 0; i < 3; i++) {
		builder->wr_id = 60 + i;
		builder->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
		ibv_wr_rdma_write(builder, remote_mr->rkey, (uintptr_t)remote + 64 * i);
		ibv_wr_set_inline_data(builder, payload, sizeof payload);
	}
	CHECK(ibv_wr_complete(builder) == ENOMEM, "a batch past the send queue is ENOMEM");
	no_completion("a refused batch");
	for (int i = 0; i < 3 * 64; i++)
		CHECK(remote[i] == 0, "a refused batch wrote byte %d", i);
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_qp(peer) == 0, "destroy the QPs");
}

/* Inline lengths are checked before they are narrowed: a length of
 * 2^32 + 16 was cut to 16 and posted 16 bytes. And a list of more buffers
 * than a gather list takes (five) posts within the inline bytes, as
 * rdma-core's providers allow: it was refused. */
static void inline_lengths_are_checked_whole(union ibv_gid gid, uint8_t *remote, struct ibv_mr *remote_mr)
{
	struct ibv_qp *qp, *peer;
	make_builder_pair(gid, 4, &qp, &peer);
	struct ibv_qp_ex *builder = ibv_qp_to_qp_ex(qp);
	CHECK(builder, "qp_to_qp_ex");
	static char payload[64] = "inline";
	memset(remote, 0, 64);
	ibv_wr_start(builder);
	builder->wr_id = 80;
	builder->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(builder, remote_mr->rkey, (uintptr_t)remote);
	ibv_wr_set_inline_data(builder, payload, ((size_t)1 << 32) + 16);
	CHECK(ibv_wr_complete(builder) == EINVAL, "an inline length past 32 bits is EINVAL");
	no_completion("an inline length past 32 bits");
	char pieces[5][8];
	struct ibv_data_buf list[5];
	for (int i = 0; i < 5; i++) {
		memset(pieces[i], 'a' + i, 8);
		list[i] = (struct ibv_data_buf){ .addr = pieces[i], .length = 8 };
	}
	ibv_wr_start(builder);
	builder->wr_id = 81;
	builder->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(builder, remote_mr->rkey, (uintptr_t)remote);
	ibv_wr_set_inline_data_list(builder, 5, list);
	CHECK(ibv_wr_complete(builder) == 0, "five inline buffers post");
	struct ibv_wc wc = complete();
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 81, "the five-buffer WRITE completes");
	for (int i = 0; i < 40; i++)
		CHECK(remote[i] == 'a' + i / 8, "byte %d of the five-buffer WRITE", i);
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_qp(peer) == 0, "destroy the QPs");
}

/* ibv_close_device(3) with objects left: the kernel takes down what a
 * closed context made. Here its memory region stayed registered, and a
 * peer's WRITE landed in memory the program had given up. */
static void a_closed_contexts_objects_are_taken_down(union ibv_gid gid, uint8_t *local,
						    struct ibv_mr *local_mr)
{
	struct ibv_device **devices = ibv_get_device_list(NULL);
	CHECK(devices, "device list");
	struct ibv_context *closing = ibv_open_device(devices[0]);
	ibv_free_device_list(devices);
	CHECK(closing, "a second context");
	struct ibv_pd *closing_pd = ibv_alloc_pd(closing);
	struct ibv_cq *closing_cq = ibv_create_cq(closing, 8, NULL, NULL, 0);
	static uint8_t target[64];
	memset(target, 0xaa, sizeof target);
	struct ibv_mr *target_mr = ibv_reg_mr(closing_pd, target, sizeof target,
					      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(closing_pd && closing_cq && target_mr, "the second context's objects");
	struct ibv_qp_init_attr init = {
		.send_cq = closing_cq, .recv_cq = closing_cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *far = ibv_create_qp(closing_pd, &init);
	CHECK(far, "the second context's QP");
	to_init(far, IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp *near = make_qp();
	connect_qp(near, far->qp_num, gid);
	connect_qp(far, near->qp_num, gid);
	uint32_t rkey = target_mr->rkey;
	CHECK(ibv_close_device(closing) == 0, "close a context with objects left");
	memset(local, 0x55, 64);
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 64, .lkey = local_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 90, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = (uintptr_t)target, .rkey = rkey } };
	struct ibv_wc wc = post_one(near, &wr);
	CHECK(wc.wr_id == 90 && wc.status != IBV_WC_SUCCESS, "a WRITE to a closed context's region fails");
	for (int i = 0; i < 64; i++)
		CHECK(target[i] == 0xaa, "byte %d of a closed context's region was written", i);
	CHECK(ibv_destroy_qp(near) == 0, "destroy the QP");
}

/* Closing a device with its queues left frees their device slots, the
 * inline staging of its QPs' included: kept, a program that opened the
 * device, made a CQ and an inline QP and closed it found the device full
 * after about a thousand rounds. */
static void closing_with_queues_left_frees_their_slots(void)
{
	for (int round = 0; round < 1100; round++) {
		struct ibv_device **devices = ibv_get_device_list(NULL);
		CHECK(devices, "device list in round %d", round);
		struct ibv_context *opened = ibv_open_device(devices[0]);
		ibv_free_device_list(devices);
		CHECK(opened, "open in round %d", round);
		struct ibv_pd *round_pd = ibv_alloc_pd(opened);
		struct ibv_cq *round_cq = ibv_create_cq(opened, 4, NULL, NULL, 0);
		CHECK(round_pd && round_cq, "a PD and a CQ in round %d", round);
		struct ibv_qp_init_attr init = {
			.send_cq = round_cq, .recv_cq = round_cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1,
				 .max_inline_data = 64 },
		};
		CHECK(ibv_create_qp(round_pd, &init), "an inline QP in round %d", round);
		CHECK(ibv_close_device(opened) == 0, "close in round %d", round);
	}
}

/* A caller built against a newer header passes a longer struct to the
 * extended queries: rdma-core zeroes the whole of it, and here its tail
 * was left as the caller's garbage. */
static void extended_queries_zero_a_longer_callers_tail(void)
{
	struct verbs_context *ports = verbs_get_ctx_op(context, query_port);
	struct verbs_context *devices = verbs_get_ctx_op(context, query_device_ex);
	CHECK(ports && devices, "the extended query operations");
	unsigned char port[sizeof(struct ibv_port_attr) + 8];
	memset(port, 0xaa, sizeof port);
	CHECK(ports->query_port(context, 1, (struct ibv_port_attr *)port, sizeof port) == 0, "query_port");
	for (size_t i = sizeof(struct ibv_port_attr); i < sizeof port; i++)
		CHECK(port[i] == 0, "byte %zu past ibv_port_attr was left", i);
	unsigned char device[sizeof(struct ibv_device_attr_ex) + 8];
	memset(device, 0xaa, sizeof device);
	CHECK(devices->query_device_ex(context, NULL, (struct ibv_device_attr_ex *)device, sizeof device) == 0,
	      "query_device_ex");
	for (size_t i = sizeof(struct ibv_device_attr_ex); i < sizeof device; i++)
		CHECK(device[i] == 0, "byte %zu past ibv_device_attr_ex was left", i);
}

/* ibv_get_async_event(3) waits on async_fd; on a non-blocking one with no
 * event it answers -1 with EAGAIN. It answered EOPNOTSUPP at once, and an
 * event thread that retries spun on a core. */
static void no_async_event_is_eagain_on_a_non_blocking_descriptor(void)
{
	int flags = fcntl(context->async_fd, F_GETFL);
	CHECK(fcntl(context->async_fd, F_SETFL, flags | O_NONBLOCK) == 0, "non-blocking async_fd");
	struct ibv_async_event event;
	errno = 0;
	CHECK(ibv_get_async_event(context, &event) == -1 && errno == EAGAIN, "no event is EAGAIN (errno %d)",
	      errno);
	CHECK(fcntl(context->async_fd, F_SETFL, flags) == 0, "blocking again");
}

/* Takes every event waiting on the (non-blocking) async_fd: what earlier
 * checks raised. */
static void drain_async_events(void)
{
	struct ibv_async_event event;
	for (int i = 0; i < 4096 && ibv_get_async_event(context, &event) == 0; i++)
		ibv_ack_async_event(&event);
}

/* The next async event, waiting up to 5 s for it, not yet acknowledged. */
static struct ibv_async_event take_async_event(void)
{
	struct pollfd readable = { .fd = context->async_fd, .events = POLLIN };
	CHECK(poll(&readable, 1, 5000) == 1, "an async event came");
	struct ibv_async_event event;
	CHECK(ibv_get_async_event(context, &event) == 0, "get_async_event (errno %d)", errno);
	return event;
}

/* The next async event, acknowledged. */
static struct ibv_async_event next_async_event(void)
{
	struct ibv_async_event event = take_async_event();
	ibv_ack_async_event(&event);
	return event;
}

static int async_event_waits(void)
{
	struct pollfd readable = { .fd = context->async_fd, .events = POLLIN };
	return poll(&readable, 1, 0);
}

/* Makes async_fd non-blocking with no event waiting; its flags before. */
static int async_fd_emptied_and_non_blocking(void)
{
	int flags = fcntl(context->async_fd, F_GETFL);
	CHECK(fcntl(context->async_fd, F_SETFL, flags | O_NONBLOCK) == 0, "non-blocking async_fd");
	drain_async_events();
	return flags;
}

static struct ibv_srq *make_srq(void)
{
	struct ibv_srq_init_attr srq_init = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &srq_init);
	CHECK(srq, "create_srq");
	return srq;
}

/* ibv_modify_srq was EOPNOTSUPP and no async event ever came: a program
 * that refills its SRQ on IBV_EVENT_SRQ_LIMIT_REACHED ran dry. */
static void an_srq_below_its_limit_raises_its_event_once(union ibv_gid gid, uint8_t *local,
							 struct ibv_mr *local_mr, uint8_t *remote,
							 struct ibv_mr *remote_mr)
{
	int flags = async_fd_emptied_and_non_blocking();
	struct ibv_srq *srq = make_srq();
	struct ibv_qp_init_attr init = { .send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_send_sge = 1 } };
	struct ibv_qp *receiver = ibv_create_qp(pd, &init), *sender = make_qp();
	CHECK(receiver, "a QP on the SRQ");
	to_init(receiver, IBV_ACCESS_REMOTE_WRITE);
	connect_qp(sender, receiver->qp_num, gid);
	connect_qp(receiver, sender->qp_num, gid);
	for (uint64_t id = 0; id < 4; id++) {
		struct ibv_sge sge = { .addr = (uintptr_t)remote + 64 * id, .length = 64, .lkey = remote_mr->lkey };
		struct ibv_recv_wr receive = { .wr_id = 100 + id, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(ibv_post_srq_recv(srq, &receive, &bad) == 0, "post an SRQ receive");
	}
	struct ibv_srq_attr limits = { .max_wr = 99 };
	CHECK(ibv_modify_srq(srq, &limits, IBV_SRQ_MAX_WR) == EINVAL, "resizing is EINVAL");
	limits.srq_limit = 9;
	CHECK(ibv_modify_srq(srq, &limits, IBV_SRQ_LIMIT) == EINVAL, "a limit past the depth is EINVAL");
	limits.srq_limit = 3;
	CHECK(ibv_modify_srq(srq, &limits, IBV_SRQ_LIMIT) == 0, "arm the limit");
	struct ibv_srq_attr queried;
	CHECK(ibv_query_srq(srq, &queried) == 0 && queried.srq_limit == 3 && queried.max_wr >= 8, "query_srq");
	CHECK(async_event_waits() == 0, "four receives are not below three");
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 8, .lkey = local_mr->lkey };
	struct ibv_send_wr send = { .wr_id = 60, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED };
	for (int round = 0; round < 3; round++) {
		for (int side = 0; side < 2; side++) {
			struct ibv_wc wc = side == 0 ? post_one(sender, &send) : complete();
			CHECK(wc.status == IBV_WC_SUCCESS, "SEND %d side %d: %s", round, side,
			      ibv_wc_status_str(wc.status));
		}
		if (round == 0) {
			CHECK(async_event_waits() == 0, "three receives are not below three");
		} else if (round == 1) {
			struct ibv_async_event event = next_async_event();
			CHECK(event.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && event.element.srq == srq,
			      "the SRQ's limit event (type %d)", event.event_type);
			CHECK(ibv_query_srq(srq, &queried) == 0 && queried.srq_limit == 0, "the limit disarmed");
		} else {
			CHECK(async_event_waits() == 0, "a disarmed limit raises nothing more");
		}
	}
	CHECK(ibv_destroy_qp(sender) == 0 && ibv_destroy_qp(receiver) == 0, "destroy the QPs");
	CHECK(ibv_destroy_srq(srq) == 0, "destroy the SRQ");
	CHECK(fcntl(context->async_fd, F_SETFL, flags) == 0, "blocking again");
}

/* A QP on an SRQ that went to ERR raised nothing: programs wait for
 * IBV_EVENT_QP_LAST_WQE_REACHED before they destroy such a QP. It names
 * the QP, once per error (a reset QP's next error raises it again); a QP
 * with its own receive queue raises none; and a destroy waits for the
 * program to acknowledge one it took. */
static void a_qp_on_an_srq_raises_last_wqe_reached_in_error(void)
{
	int flags = async_fd_emptied_and_non_blocking();
	struct ibv_srq *srq = make_srq();
	struct ibv_qp_init_attr init = { .send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_send_sge = 1 } };
	struct ibv_qp *on_srq = ibv_create_qp(pd, &init), *own = make_qp();
	CHECK(on_srq, "a QP on the SRQ");
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(own, &attr, IBV_QP_STATE) == 0, "the QP with its own receive queue to ERR");
	for (int round = 0; round < 2; round++) {
		to_init(on_srq, IBV_ACCESS_REMOTE_WRITE);
		attr.qp_state = IBV_QPS_ERR;
		CHECK(ibv_modify_qp(on_srq, &attr, IBV_QP_STATE) == 0, "the QP on the SRQ to ERR");
		struct ibv_async_event event = take_async_event();
		CHECK(event.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && event.element.qp == on_srq,
		      "round %d: the QP's last-WQE event (type %d)", round, event.event_type);
		CHECK(async_event_waits() == 0, "round %d: one event, none for the other QP", round);
		if (round == 1) {
			CHECK(ibv_destroy_qp(on_srq) == EBUSY, "a destroy waits for the event's acknowledgement");
		}
		ibv_ack_async_event(&event);
		attr.qp_state = IBV_QPS_RESET;
		CHECK(ibv_modify_qp(on_srq, &attr, IBV_QP_STATE) == 0, "reset");
	}
	CHECK(ibv_destroy_qp(on_srq) == 0 && ibv_destroy_qp(own) == 0, "destroy the QPs");
	CHECK(ibv_destroy_srq(srq) == 0, "destroy the SRQ");
	CHECK(fcntl(context->async_fd, F_SETFL, flags) == 0, "blocking again");
}

/* An overrun CQ raised nothing: IBV_EVENT_CQ_ERR names it on async_fd,
 * and a CQ destroyed with its event unread takes the event with it. */
static void an_overrun_cq_raises_its_event(union ibv_gid gid, uint8_t *local, struct ibv_mr *local_mr,
					   uint8_t *remote, struct ibv_mr *remote_mr)
{
	int flags = fcntl(context->async_fd, F_GETFL);
	CHECK(fcntl(context->async_fd, F_SETFL, flags | O_NONBLOCK) == 0, "non-blocking async_fd");
	drain_async_events();
	for (int read_it = 1; read_it >= 0; read_it--) {
		struct ibv_cq *tiny = ibv_create_cq(context, 1, NULL, NULL, 0);
		CHECK(tiny && tiny->cqe == 1, "a CQ of one entry");
		struct ibv_qp *a = make_qp_on(tiny), *b = make_qp();
		connect_qp(a, b->qp_num, gid);
		connect_qp(b, a->qp_num, gid);
		struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 8, .lkey = local_mr->lkey };
		struct ibv_send_wr third = { .wr_id = 3, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)remote, .rkey = remote_mr->rkey } };
		struct ibv_send_wr second = third, first = third, *bad = NULL;
		second.wr_id = 2;
		second.next = &third;
		first.wr_id = 1;
		first.next = &second;
		CHECK(ibv_post_send(a, &first, &bad) == 0, "three signalled WRITEs");
		if (read_it) {
			struct ibv_async_event event = take_async_event();
			CHECK(event.event_type == IBV_EVENT_CQ_ERR && event.element.cq == tiny,
			      "the CQ's overrun event (type %d)", event.event_type);
			/* A batch poll: the completion written before the overrun is
			 * the caller's (a batch that met the overrun returned -1 and
			 * lost it), and the overrun comes at the next poll. */
			struct ibv_wc wcs[4];
			CHECK(ibv_poll_cq(tiny, 4, wcs) == 1 && wcs[0].wr_id == 1 && wcs[0].status == IBV_WC_SUCCESS,
			      "the completion written before the overrun");
			CHECK(ibv_poll_cq(tiny, 4, wcs) < 0, "then the overrun");
			/* rdma-core's destroy waits for the event to be acknowledged:
			 * freed before, the event named freed memory. */
			CHECK(ibv_destroy_qp(a) == 0, "destroy the QP on the overrun CQ");
			CHECK(ibv_destroy_cq(tiny) == EBUSY, "a CQ whose event is not acknowledged stays");
			ibv_ack_async_event(&event);
			a = make_qp_on(tiny);
		} else {
			struct pollfd readable = { .fd = context->async_fd, .events = POLLIN };
			CHECK(poll(&readable, 1, 5000) == 1, "the second overrun's event waits");
		}
		CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy the QPs");
		CHECK(ibv_destroy_cq(tiny) == 0, "destroy the overrun CQ");
	}
	CHECK(async_event_waits() == 0, "a destroyed CQ's unread event went with it");
	struct ibv_async_event event;
	errno = 0;
	CHECK(ibv_get_async_event(context, &event) == -1 && errno == EAGAIN, "no event is left (errno %d)", errno);
	CHECK(fcntl(context->async_fd, F_SETFL, flags) == 0, "blocking again");
}

/* What the two builders of the critical-section check share. */
struct builder_race {
	struct ibv_qp_ex *builder;
	struct ibv_mr *remote_mr;
	uint8_t *remote;
	int first_is_building;   /* the first thread is inside its section */
	int first_is_completing; /* ... and about to call ibv_wr_complete */
	int first_result;
	int second_found_first_completing;
	int second_result;
};

static void build_one_write(struct builder_race *race, uint64_t wr_id, int offset)
{
	static uint8_t payload[8] = { 7, 7, 7, 7, 7, 7, 7, 7 };
	race->builder->wr_id = wr_id;
	race->builder->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(race->builder, race->remote_mr->rkey, (uintptr_t)race->remote + offset);
	ibv_wr_set_inline_data(race->builder, payload, sizeof payload);
}

/* Starts a section, builds one WRITE, lets the second thread try to start
 * its own, builds a second WRITE 200 ms later, and completes. */
static void *build_slowly(void *argument)
{
	struct builder_race *race = argument;
	ibv_wr_start(race->builder);
	build_one_write(race, 80, 0);
	__atomic_store_n(&race->first_is_building, 1, __ATOMIC_SEQ_CST);
	struct timespec pause = { .tv_sec = 0, .tv_nsec = 200 * 1000 * 1000 };
	nanosleep(&pause, NULL);
	build_one_write(race, 81, 64);
	__atomic_store_n(&race->first_is_completing, 1, __ATOMIC_SEQ_CST);
	race->first_result = ibv_wr_complete(race->builder);
	return NULL;
}

/* Starts a section once the first thread is inside its own. */
static void *build_meanwhile(void *argument)
{
	struct builder_race *race = argument;
	while (!__atomic_load_n(&race->first_is_building, __ATOMIC_SEQ_CST))
		sched_yield();
	ibv_wr_start(race->builder);
	race->second_found_first_completing = __atomic_load_n(&race->first_is_completing, __ATOMIC_SEQ_CST);
	build_one_write(race, 82, 128);
	race->second_result = ibv_wr_complete(race->builder);
	return NULL;
}

/* ibv_wr_post(3): the provider makes ibv_wr_start ... ibv_wr_complete a
 * per-QP critical section that no other thread enters. Without it, a
 * second thread's ibv_wr_start went ahead and cleared the first's list of
 * requests being built: the first thread's first WRITE was never posted. */
static void a_second_builder_waits_for_the_first_to_complete(union ibv_gid gid, uint8_t *remote,
							     struct ibv_mr *remote_mr)
{
	struct ibv_qp *qp, *peer;
	make_builder_pair(gid, 8, &qp, &peer);
	struct builder_race race = { .builder = ibv_qp_to_qp_ex(qp), .remote_mr = remote_mr, .remote = remote };
	pthread_t first, second;
	CHECK(pthread_create(&first, NULL, build_slowly, &race) == 0, "start the first builder");
	CHECK(pthread_create(&second, NULL, build_meanwhile, &race) == 0, "start the second builder");
	CHECK(pthread_join(first, NULL) == 0 && pthread_join(second, NULL) == 0, "join the builders");
	CHECK(race.second_found_first_completing, "the second ibv_wr_start returned inside the first's section");
	CHECK(race.first_result == 0 && race.second_result == 0, "both batches post (%d, %d)", race.first_result,
	      race.second_result);
	int seen[3] = { 0, 0, 0 };
	for (int i = 0; i < 3; i++) {
		struct ibv_wc wc = complete();
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id >= 80 && wc.wr_id <= 82 && !seen[wc.wr_id - 80],
		      "wr_id %lu unknown, failed or completed twice", (unsigned long)wc.wr_id);
		seen[wc.wr_id - 80] = 1;
	}
	no_completion("each built WRITE completed once");
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_qp(peer) == 0, "destroy the QPs");
}

static void *complete_from_elsewhere(void *argument)
{
	return (void *)(intptr_t)ibv_wr_complete(argument);
}

/* The section's misuses: a thread that starts twice waited on itself for
 * ever; a thread that completes another's section posted its half-built
 * batch; a QP destroyed inside a section freed the lock others wait on. */
static void a_builder_section_is_its_threads_alone(union ibv_gid gid, uint8_t *remote,
						   struct ibv_mr *remote_mr)
{
	struct ibv_qp *qp, *peer;
	make_builder_pair(gid, 8, &qp, &peer);
	struct builder_race race = { .builder = ibv_qp_to_qp_ex(qp), .remote_mr = remote_mr, .remote = remote };
	ibv_wr_start(race.builder);
	build_one_write(&race, 90, 0);
	ibv_wr_start(race.builder); /* starts over, and does not wait for itself */
	build_one_write(&race, 91, 64);
	pthread_t other;
	void *result;
	CHECK(pthread_create(&other, NULL, complete_from_elsewhere, race.builder) == 0, "start a thread");
	CHECK(pthread_join(other, &result) == 0 && (intptr_t)result == EINVAL,
	      "another thread's ibv_wr_complete is EINVAL, not %d", (int)(intptr_t)result);
	CHECK(ibv_destroy_qp(qp) == EBUSY, "a QP inside a section is busy");
	CHECK(ibv_wr_complete(race.builder) == 0, "the holder completes");
	struct ibv_wc wc = complete();
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 91, "only the second batch posted (wr_id %lu)",
	      (unsigned long)wc.wr_id);
	no_completion("the batch started over");
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_qp(peer) == 0, "destroy the QPs");
}

/* What the threads that post on one QP at once share. */
struct concurrent_posts {
	struct ibv_qp *qp;
	struct ibv_mr *remote_mr;
	uint8_t *remote;
	pthread_barrier_t round_starts;
	pthread_barrier_t round_posted;
	int failed;
};

enum { CONCURRENT_THREADS = 2, CONCURRENT_ROUNDS = 200 };

struct concurrent_poster {
	struct concurrent_posts *shared;
	int index;
};

/* Each round, posts one inline WRITE of its own bytes to its own offset,
 * at the same moment as the other thread. */
static void *post_in_rounds(void *argument)
{
	struct concurrent_poster *poster = argument;
	struct concurrent_posts *shared = poster->shared;
	for (int round = 0; round < CONCURRENT_ROUNDS; round++) {
		uint8_t payload[8];
		memset(payload, round * CONCURRENT_THREADS + poster->index + 1, sizeof payload);
		struct ibv_sge sge = { .addr = (uintptr_t)payload, .length = sizeof payload };
		struct ibv_send_wr wr = { .wr_id = (uint64_t)round * CONCURRENT_THREADS + poster->index,
			.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
			.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
			.wr.rdma = { .remote_addr = (uintptr_t)shared->remote + 64 * poster->index,
				     .rkey = shared->remote_mr->rkey } };
		struct ibv_send_wr *bad = NULL;
		pthread_barrier_wait(&shared->round_starts);
		if (ibv_post_send(shared->qp, &wr, &bad) != 0)
			__atomic_store_n(&shared->failed, 1, __ATOMIC_SEQ_CST);
		pthread_barrier_wait(&shared->round_posted);
	}
	return NULL;
}

/* libibverbs' verbs are thread-safe: threads post on one QP at once. The
 * library held each QP as `&mut` in every call, so two such calls aliased
 * it (undefined behaviour in Rust); its objects are shared now, and each
 * thread's inline bytes must still land where its own WRITE said. */
static void threads_post_on_one_qp_at_once(union ibv_gid gid, uint8_t *remote, struct ibv_mr *remote_mr)
{
	struct ibv_qp *qp = make_qp(), *peer = make_qp();
	connect_qp(qp, peer->qp_num, gid);
	connect_qp(peer, qp->qp_num, gid);
	struct concurrent_posts shared = { .qp = qp, .remote_mr = remote_mr, .remote = remote };
	CHECK(pthread_barrier_init(&shared.round_starts, NULL, CONCURRENT_THREADS + 1) == 0 &&
		      pthread_barrier_init(&shared.round_posted, NULL, CONCURRENT_THREADS + 1) == 0,
	      "barriers");
	struct concurrent_poster posters[CONCURRENT_THREADS];
	pthread_t threads[CONCURRENT_THREADS];
	for (int i = 0; i < CONCURRENT_THREADS; i++) {
		posters[i] = (struct concurrent_poster){ .shared = &shared, .index = i };
		CHECK(pthread_create(&threads[i], NULL, post_in_rounds, &posters[i]) == 0, "start a poster");
	}
	for (int round = 0; round < CONCURRENT_ROUNDS; round++) {
		pthread_barrier_wait(&shared.round_starts);
		pthread_barrier_wait(&shared.round_posted);
		CHECK(!__atomic_load_n(&shared.failed, __ATOMIC_SEQ_CST), "a concurrent post failed in round %d",
		      round);
		for (int i = 0; i < CONCURRENT_THREADS; i++) {
			struct ibv_wc wc = complete();
			CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id / CONCURRENT_THREADS == (uint64_t)round,
			      "round %d: wr_id %lu, status %d", round, (unsigned long)wc.wr_id, wc.status);
		}
		for (int i = 0; i < CONCURRENT_THREADS; i++)
			for (int byte = 0; byte < 8; byte++)
				CHECK(remote[64 * i + byte] == (uint8_t)(round * CONCURRENT_THREADS + i + 1),
				      "round %d: thread %d's byte %d is %d", round, i, byte, remote[64 * i + byte]);
	}
	for (int i = 0; i < CONCURRENT_THREADS; i++)
		CHECK(pthread_join(threads[i], NULL) == 0, "join a poster");
	no_completion("each WRITE completed once");
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_qp(peer) == 0, "destroy the QPs");
}

/* IBV_SEND_INLINE means nothing to a READ (ibv_post_send ignores it): the
 * builder took the READ's SGE for inline data, so the answer landed in
 * its staging slot and the program's buffer stayed as it was. */
static void an_inline_flag_on_a_built_read_is_ignored(union ibv_gid gid, uint8_t *local,
						      struct ibv_mr *local_mr, uint8_t *remote,
						      struct ibv_mr *remote_mr)
{
	struct ibv_qp *qp, *peer;
	make_builder_pair(gid, 4, &qp, &peer);
	struct ibv_qp_ex *builder = ibv_qp_to_qp_ex(qp);
	for (int i = 0; i < 64; i++) {
		remote[i] = (uint8_t)(i + 9);
		local[i] = 0;
	}
	ibv_wr_start(builder);
	builder->wr_id = 70;
	builder->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_read(builder, remote_mr->rkey, (uintptr_t)remote);
	ibv_wr_set_sge(builder, local_mr->lkey, (uintptr_t)local, 64);
	CHECK(ibv_wr_complete(builder) == 0, "a built READ posts");
	struct ibv_wc wc = complete();
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 70, "the READ completes");
	CHECK(memcmp(local, remote, 64) == 0, "the READ's answer is in the program's buffer");
	/* Inline data named for a READ is refused. */
	ibv_wr_start(builder);
	builder->wr_id = 71;
	ibv_wr_rdma_read(builder, remote_mr->rkey, (uintptr_t)remote);
	ibv_wr_set_inline_data(builder, local, 8);
	CHECK(ibv_wr_complete(builder) == EINVAL, "inline data for a READ is EINVAL");
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_qp(peer) == 0, "destroy the QPs");
}

/* ibv_reg_mr(3): remote write or atomic access needs local write. */
static void remote_write_without_local_write_is_refused(void)
{
	static char page[64];
	errno = 0;
	CHECK(ibv_reg_mr(pd, page, sizeof page, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
	      "REMOTE_WRITE without LOCAL_WRITE is EINVAL");
	errno = 0;
	CHECK(ibv_reg_mr(pd, page, sizeof page, IBV_ACCESS_REMOTE_ATOMIC) == NULL && errno == EINVAL,
	      "REMOTE_ATOMIC without LOCAL_WRITE is EINVAL");
	struct ibv_mr *mr = ibv_reg_mr(pd, page, sizeof page, IBV_ACCESS_REMOTE_READ);
	CHECK(mr && ibv_dereg_mr(mr) == 0, "REMOTE_READ alone is fine");
}

/* A receive chain of exactly the queue's depth posts whole: the walk
 * ended its loop and returned EINVAL, with bad_wr unset, for work it had
 * all queued. */
static void a_chain_as_long_as_the_queue_posts(void)
{
	struct ibv_device_attr device;
	CHECK(ibv_query_device(context, &device) == 0, "query_device");
	int depth = device.max_qp_wr;
	struct ibv_qp_init_attr init = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = depth, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp, "a QP with a receive queue of %d", depth);
	to_init(qp, 0);
	struct ibv_recv_wr *chain = calloc(depth + 1, sizeof *chain);
	CHECK(chain, "calloc");
	for (int i = 0; i <= depth; i++)
		chain[i] = (struct ibv_recv_wr){ .wr_id = i, .next = i + 1 <= depth ? &chain[i + 1] : NULL };
	chain[depth - 1].next = NULL;
	struct ibv_recv_wr *bad = NULL;
	CHECK(ibv_post_recv(qp, chain, &bad) == 0, "a chain of %d receives posts", depth);
	CHECK(ibv_destroy_qp(qp) == 0, "destroy the QP");
	free(chain);
}

/* A QP whose inline staging could not be registered (every memory region
 * taken) was refused but left in the device: its CQ could never be
 * destroyed after (EBUSY). */
static void a_refused_qp_leaves_its_cq_free(void)
{
	struct ibv_cq *completions = ibv_create_cq(context, 8, NULL, NULL, 0);
	CHECK(completions, "create_cq");
	enum { MOST_REGIONS = 8192 };
	static char page[64];
	struct ibv_mr **regions = calloc(MOST_REGIONS, sizeof *regions);
	CHECK(regions, "calloc");
	int count = 0;
	while (count < MOST_REGIONS && (regions[count] = ibv_reg_mr(pd, page, sizeof page, 0)))
		count++;
	CHECK(count < MOST_REGIONS, "the device has a last memory region");
	struct ibv_qp_init_attr init = {
		.send_cq = completions, .recv_cq = completions, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 64 },
	};
	errno = 0;
	CHECK(ibv_create_qp(pd, &init) == NULL && errno == ENOMEM,
	      "an inline QP with no memory region left is ENOMEM");
	for (int i = 0; i < count; i++)
		CHECK(ibv_dereg_mr(regions[i]) == 0, "dereg_mr");
	free(regions);
	CHECK(ibv_destroy_cq(completions) == 0, "the refused QP's CQ is free to destroy");
}

int main(void)
{
	int count = 0;
	struct ibv_device **devices = ibv_get_device_list(&count);
	CHECK(devices && count == 1, "one device");
	CHECK(strcmp(ibv_get_device_name(devices[0]), "remora0") == 0, "named remora0");
	/* ibv_devices lists it before any open (it was 0 until then). */
	__be64 listed_guid = ibv_get_device_guid(devices[0]);
	context = ibv_open_device(devices[0]);
	CHECK(context, "open_device");
	struct ibv_device_attr attributes;
	CHECK(ibv_query_device(context, &attributes) == 0, "query_device");
	CHECK(listed_guid != 0 && listed_guid == attributes.node_guid, "the GUID listed before the open is the device's");
	ibv_free_device_list(devices);
	union ibv_gid gid;
	CHECK(ibv_query_gid(context, 1, 0, &gid) == 0, "query_gid");
	CHECK(gid.raw[10] == 0xff && gid.raw[11] == 0xff && gid.raw[12] == 127, "an IPv4-mapped GID");
	pd = ibv_alloc_pd(context);
	CHECK(pd, "alloc_pd");
	cq = ibv_create_cq(context, 64, NULL, NULL, 0);
	CHECK(cq, "create_cq");
	refusals();
	many_lifetimes();

	/* Unaligned on purpose: registered at the program's own address. */
	uint8_t *raw = malloc(2 * BUFFER_BYTES + 16);
	uint8_t *local = raw + 3, *remote = raw + BUFFER_BYTES + 8;
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *local_mr = ibv_reg_mr(pd, local, BUFFER_BYTES, access);
	struct ibv_mr *remote_mr = ibv_reg_mr(pd, remote, BUFFER_BYTES, access);
	CHECK(local_mr && remote_mr, "reg_mr");
	struct ibv_qp *a = make_qp(), *b = make_qp();
	connect_qp(a, b->qp_num, gid);
	connect_qp(b, a->qp_num, gid);
	/* Objects in use are not destroyed: QPs use the CQ, MRs the PD. */
	CHECK(ibv_destroy_cq(cq) == EBUSY, "a CQ that QPs use is busy");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "a PD with MRs and QPs is busy");

	/* WRITE 4000 bytes, then READ them back elsewhere. */
	for (int i = 0; i < 4000; i++)
		local[i] = (uint8_t)(i * 7 + 1);
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 4000, .lkey = local_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)remote, .rkey = remote_mr->rkey } };
	struct ibv_wc wc = post_one(a, &wr);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 1, "WRITE completes");
	CHECK(memcmp(local, remote, 4000) == 0, "WRITE landed");
	memset(local, 0, 4000);
	wr.wr_id = 2;
	wr.opcode = IBV_WR_RDMA_READ;
	wc = post_one(a, &wr);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ, "READ completes");
	CHECK(memcmp(local, remote, 4000) == 0, "READ brought the bytes back");

	/* Atomics on an aligned word of the remote buffer. */
	uint64_t *word = (uint64_t *)(remote + 4096);
	*word = 41;
	sge.length = 8;
	sge.addr = (uintptr_t)(local + 5); /* 8-aligned: local = raw + 3 */
	wr.wr_id = 3;
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.remote_addr = (uintptr_t)word;
	wr.wr.atomic.rkey = remote_mr->rkey;
	wr.wr.atomic.compare_add = 1;
	wc = post_one(a, &wr);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FETCH_ADD, "FETCH_ADD completes");
	CHECK(*(uint64_t *)(local + 5) == 41 && *word == 42, "FETCH_ADD returned 41 and left 42");
	wr.wr_id = 4;
	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.compare_add = 42;
	wr.wr.atomic.swap = 7;
	wc = post_one(a, &wr);
	CHECK(wc.status == IBV_WC_SUCCESS && *word == 7, "CAS swapped");

	/* SEND with immediate, inline, into a posted receive. */
	struct ibv_sge receive_sge = { .addr = (uintptr_t)remote, .length = 64, .lkey = remote_mr->lkey };
	struct ibv_recv_wr receive = { .wr_id = 50, .sg_list = &receive_sge, .num_sge = 1 }, *bad_receive;
	CHECK(ibv_post_recv(b, &receive, &bad_receive) == 0, "post_recv");
	char message[] = "inline hello";
	struct ibv_sge inline_sge = { .addr = (uintptr_t)message, .length = sizeof message, .lkey = 0 };
	struct ibv_send_wr send = { .wr_id = 5, .sg_list = &inline_sge, .num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
		.imm_data = htobe32(0xabcd) };
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(a, &send, &bad) == 0, "post inline SEND");
	int seen_send = 0, seen_receive = 0;
	for (int i = 0; i < 2; i++) {
		wc = complete();
		CHECK(wc.status == IBV_WC_SUCCESS, "SEND side %d status %d", i, wc.status);
		if (wc.opcode == IBV_WC_RECV) {
			seen_receive = 1;
			CHECK(wc.wr_id == 50 && wc.byte_len == sizeof message, "receive length");
			CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == 0xabcd, "immediate");
		} else {
			seen_send = wc.opcode == IBV_WC_SEND;
		}
	}
	CHECK(seen_send && seen_receive, "both sides of the SEND completed");
	CHECK(memcmp(remote, message, sizeof message) == 0, "the inline payload arrived");

	/* An empty inline WRITE may name no address at all. */
	struct ibv_sge empty = { .addr = 0, .length = 0, .lkey = 0 };
	struct ibv_send_wr nothing = { .wr_id = 8, .sg_list = &empty, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
		.wr.rdma = { .remote_addr = (uintptr_t)remote, .rkey = remote_mr->rkey } };
	wc = post_one(a, &nothing);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 8, "an empty inline WRITE from a null address completes");

	/* Bad local arguments: too many SGEs, with bad_wr naming the request. */
	struct ibv_sge five[5] = { sge, sge, sge, sge, sge };
	struct ibv_send_wr too_many = { .wr_id = 6, .sg_list = five, .num_sge = 5, .opcode = IBV_WR_RDMA_WRITE,
		.wr.rdma = { .remote_addr = (uintptr_t)remote, .rkey = remote_mr->rkey } };
	CHECK(ibv_post_send(a, &too_many, &bad) == EINVAL && bad == &too_many, "five SGEs are EINVAL");

	/* Remote faults become NAKs and error completions. */
	sge.addr = (uintptr_t)local;
	sge.length = 64;
	wr.wr_id = 7;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = (uintptr_t)remote + BUFFER_BYTES - 8;
	wr.wr.rdma.rkey = remote_mr->rkey;
	wc = post_one(a, &wr);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "a WRITE past the region is a remote access error, not %s",
	      ibv_wc_status_str(wc.status));
	a_refused_inline_send_leaves_the_others_alone(gid, remote, remote_mr);
	destroyed_queue_events(gid, local, local_mr, remote, remote_mr);
	a_flush_raises_the_armed_event(remote, remote_mr);
	solicited_only_waits_for_a_solicited_receive(gid, local, local_mr, remote, remote_mr);
	a_fenced_send_carries_what_its_read_brought(gid, local, local_mr, remote, remote_mr);
	a_signal_ends_the_wait_for_an_event_as_a_read(remote, remote_mr, 1);
	a_signal_ends_the_wait_for_an_event_as_a_read(remote, remote_mr, 0);
	a_destroyed_qp_leaves_no_completions(remote, remote_mr);
	a_qps_access_flags_bound_its_peers(gid, local, local_mr, remote, remote_mr);
	rnr_retry_zero_gives_up_at_once(gid, local, local_mr);
	a_bad_lkey_completes_with_a_local_protection_error(gid, local, local_mr, remote, remote_mr);
	a_qp_serving_no_reads_refuses_them(gid, local, local_mr, remote, remote_mr);
	path_attributes_are_checked_and_applied(gid, local, local_mr);
	a_closed_contexts_objects_are_taken_down(gid, local, local_mr);
	closing_with_queues_left_frees_their_slots();
	extended_queries_zero_a_longer_callers_tail();
	no_async_event_is_eagain_on_a_non_blocking_descriptor();
	an_srq_below_its_limit_raises_its_event_once(gid, local, local_mr, remote, remote_mr);
	a_qp_on_an_srq_raises_last_wqe_reached_in_error();
	an_overrun_cq_raises_its_event(gid, local, local_mr, remote, remote_mr);
	a_refused_batch_posts_nothing(gid, remote, remote_mr);
	inline_lengths_are_checked_whole(gid, remote, remote_mr);
	an_inline_flag_on_a_built_read_is_ignored(gid, local, local_mr, remote, remote_mr);
	a_second_builder_waits_for_the_first_to_complete(gid, remote, remote_mr);
	threads_post_on_one_qp_at_once(gid, remote, remote_mr);
	a_builder_section_is_its_threads_alone(gid, remote, remote_mr);
	remote_write_without_local_write_is_refused();
	a_chain_as_long_as_the_queue_posts();
	a_refused_qp_leaves_its_cq_free();
	printf("ok\n");
	return 0;
}
