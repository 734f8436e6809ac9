// SPDX-License-Identifier: GPL-2.0
//
// The minimal eBPF NAT of bench-dataplane: the calibration floor for a
// kernel data path that keeps its own flow table instead of conntrack, as
// the minimal Go proxy is the floor for a proxy written in Go. One IPv4
// TCP frontend, a backend picked at random per new flow, flows in LRU hash
// maps (no end-of-flow tracking, no admin state, probes, weights or
// drain). It runs on the load balancer's client-side interface of the
// routed topology: at ingress it translates a client's packets to the
// frontend into packets to the flow's backend, which the kernel then
// forwards; at egress it gives the backend's replies, forwarded back by
// the kernel (the backends route to the clients through this host), the
// frontend's address again. Nothing is translated at the source, so
// replies must come back through this host, as they do in the benchmark.
//
// Built by bench-dataplane with clang at run time; no libbpf headers.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)BPF_FUNC_map_update_elem;
static __u32 (*bpf_get_prandom_u32)(void) = (void *)BPF_FUNC_get_prandom_u32;
static long (*bpf_l3_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to, __u64 size) = (void *)BPF_FUNC_l3_csum_replace;
static long (*bpf_l4_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to, __u64 flags) = (void *)BPF_FUNC_l4_csum_replace;
static long (*bpf_skb_store_bytes)(struct __sk_buff *skb, __u32 offset, const void *from, __u32 len, __u64 flags) = (void *)BPF_FUNC_skb_store_bytes;

#define MAX_BACKENDS 16
#define MAX_FLOWS 262144

// An endpoint: address and port in network order.
struct endpoint {
	__u32 addr;
	__u16 port;
	__u16 pad;
};

// A flow as the client sees it (client, frontend) or as the backend's
// replies carry it (backend, client).
struct flow {
	struct endpoint src, dst;
};

// config: key 0 is the frontend, keys 1..n the backends; count holds n.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_BACKENDS + 1);
	__type(key, __u32);
	__type(value, struct endpoint);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} count SEC(".maps");

// forward: (client, frontend) -> backend.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct flow);
	__type(value, struct endpoint);
} forward SEC(".maps");

// reverse: (backend, client) -> frontend.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct flow);
	__type(value, struct endpoint);
} reverse SEC(".maps");

#define IP_OFF ETH_HLEN
#define TCP_OFF (ETH_HLEN + sizeof(struct iphdr))
#define IP_CSUM_OFF (IP_OFF + __builtin_offsetof(struct iphdr, check))
#define TCP_CSUM_OFF (TCP_OFF + __builtin_offsetof(struct tcphdr, check))

// parse finds an IPv4 TCP packet without IP options; NULL otherwise.
static __always_inline struct iphdr *parse(struct __sk_buff *skb, struct tcphdr **tcp) {
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != __builtin_bswap16(ETH_P_IP))
		return 0;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_TCP)
		return 0;
	struct tcphdr *t = (void *)(ip + 1);
	if ((void *)(t + 1) > end)
		return 0;
	*tcp = t;
	return ip;
}

// rewrite replaces the address at addrOff and the port at portOff with
// to's, fixing the IP and TCP checksums.
static __always_inline int rewrite(struct __sk_buff *skb, __u32 addrOff, __u32 portOff, struct endpoint from, struct endpoint to) {
	if (bpf_l4_csum_replace(skb, TCP_CSUM_OFF, from.addr, to.addr, BPF_F_PSEUDO_HDR | sizeof(to.addr)) < 0 ||
	    bpf_l4_csum_replace(skb, TCP_CSUM_OFF, from.port, to.port, sizeof(to.port)) < 0 ||
	    bpf_l3_csum_replace(skb, IP_CSUM_OFF, from.addr, to.addr, sizeof(to.addr)) < 0 ||
	    bpf_skb_store_bytes(skb, addrOff, &to.addr, sizeof(to.addr), 0) < 0 ||
	    bpf_skb_store_bytes(skb, portOff, &to.port, sizeof(to.port), 0) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

SEC("tc")
int to_backend(struct __sk_buff *skb) {
	struct tcphdr *tcp;
	struct iphdr *ip = parse(skb, &tcp);
	if (!ip)
		return TC_ACT_OK;
	__u32 zero = 0;
	struct endpoint *fe = bpf_map_lookup_elem(&config, &zero);
	__u32 *n = bpf_map_lookup_elem(&count, &zero);
	if (!fe || !n || *n == 0 || ip->daddr != fe->addr || tcp->dest != fe->port)
		return TC_ACT_OK;
	struct flow f = {.src = {.addr = ip->saddr, .port = tcp->source}, .dst = *fe};
	struct endpoint *be = bpf_map_lookup_elem(&forward, &f);
	struct endpoint picked;
	if (!be || (tcp->syn && !tcp->ack)) {
		// A new flow (or a client port reused): pick a backend.
		__u32 i = 1 + bpf_get_prandom_u32() % *n;
		struct endpoint *b = bpf_map_lookup_elem(&config, &i);
		if (!b)
			return TC_ACT_SHOT;
		picked = *b;
		struct flow r = {.src = picked, .dst = f.src};
		bpf_map_update_elem(&forward, &f, &picked, BPF_ANY);
		bpf_map_update_elem(&reverse, &r, fe, BPF_ANY);
		be = &picked;
	}
	struct endpoint to = *be;
	return rewrite(skb, IP_OFF + __builtin_offsetof(struct iphdr, daddr), TCP_OFF + __builtin_offsetof(struct tcphdr, dest), *fe, to);
}

SEC("tc")
int to_client(struct __sk_buff *skb) {
	struct tcphdr *tcp;
	struct iphdr *ip = parse(skb, &tcp);
	if (!ip)
		return TC_ACT_OK;
	struct flow r = {.src = {.addr = ip->saddr, .port = tcp->source}, .dst = {.addr = ip->daddr, .port = tcp->dest}};
	struct endpoint *fe = bpf_map_lookup_elem(&reverse, &r);
	if (!fe)
		return TC_ACT_OK;
	struct endpoint to = *fe;
	return rewrite(skb, IP_OFF + __builtin_offsetof(struct iphdr, saddr), TCP_OFF + __builtin_offsetof(struct tcphdr, source), r.src, to);
}

char LICENSE[] SEC("license") = "GPL";
