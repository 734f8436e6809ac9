// SPDX-License-Identifier: GPL-2.0
//
// The eBPF kernel path of ebb's kernel engine (`ebb lb --kernel-path
// ebpf`): IPv4 TCP frontends forwarded at tc ingress, with a flow table of
// its own instead of conntrack. The selection is the nftables path's
// (kernel_slots.go): a new flow takes a slot of its frontend (a counter,
// or a hash of the client's address for ClientIP), the slot's home owner
// (node), that owner's state, and the backend for the three. A node's
// admin Down is so one element of owners: new flows stop at once, the
// flows already in the table keep their backend.
//
// A flow is translated both ways, like a masquerading DNAT: the client's
// packets to the frontend leave to the backend from this host's address
// and a source port of its own (snat_port: outside the host's ephemeral
// ports and the node ports), and the backend's replies to that address
// and port go back to the client from the frontend. Packets are
// redirected to the interface the route names (bpf_redirect_neigh), so
// they skip the host's IP stack and netfilter.
//
// A backend at an address of this host (its own node, when the LB host is
// also a node of the cluster: the Service's node port there) is reached
// through the host's stack instead: the client's packets only have their
// destination translated and go on into the stack, where the node's own
// rules (kube-proxy's) take them to a pod, and the replies, which the
// stack sends from the backend's address to the client, get the
// frontend's address back at tc egress (ebb_egress).
//
// What the program does not translate it passes to the host's stack:
// a new flow with no eligible backend or from outside the source ranges,
// a segment of a flow it does not know (one the drain timeout ended), so
// that the stack, which has no socket at the frontend's address, answers
// with a reset, as the other engines do.
//
// A flow leaves the table with its last segment (a reset, the
// acknowledgement of the second FIN); ebb lb reads the table to count a
// backend's connections, and sweeps the idle and half-open flows.
//
// A flow is half-open (FLOW_OPENING) from the client's SYN until the
// client acknowledges the backend's answer. Only the client's packets
// keep a half-open flow alive: one whose client has been silent for
// HALF_OPEN_NS gives its source port to the first new flow that tries
// it, so that SYNs whose answers never reach their sender (a SYN flood
// from spoofed addresses) cannot hold a backend's source ports. Half-open
// flows have tables of their own (opening, opening_replies), and a flow
// moves to flows and replies at the client's acknowledgement: a flood
// whose SYNs outnumber those tables (spread over many backends, the port
// takeover does not bound it) evicts other half-open flows, never an
// established connection.
//
// Built by `make generate` with clang; the object is committed
// (ebb_lb.o). No libbpf headers.

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
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_delete_elem;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)BPF_FUNC_ktime_get_ns;
static long (*bpf_l3_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to, __u64 size) = (void *)BPF_FUNC_l3_csum_replace;
static long (*bpf_l4_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to, __u64 flags) = (void *)BPF_FUNC_l4_csum_replace;
static long (*bpf_skb_store_bytes)(struct __sk_buff *skb, __u32 offset, const void *from, __u32 len, __u64 flags) = (void *)BPF_FUNC_skb_store_bytes;
static __s64 (*bpf_csum_diff)(__be32 *from, __u32 from_size, __be32 *to, __u32 to_size, __wsum seed) = (void *)BPF_FUNC_csum_diff;
static long (*bpf_fib_lookup)(void *ctx, struct bpf_fib_lookup *params, int plen, __u32 flags) = (void *)BPF_FUNC_fib_lookup;
static long (*bpf_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) = (void *)BPF_FUNC_redirect_neigh;

#define AF_INET 2

// The source ports of translated flows, toward each backend from each of
// this host's addresses: 61000..65535 and 1024..29999, outside the
// host's ephemeral ports (net.ipv4.ip_local_port_range, 32768..60999 by
// default), so that the replies of the host's own connections (ebb's
// probes) are never taken for a flow's, and outside the node ports
// (30000..32767). That is how many connections one LB host address can
// have open to one backend at once.
#define SNAT_HIGH_MIN 61000
#define SNAT_HIGH_COUNT 4536
#define SNAT_LOW_MIN 1024
#define SNAT_LOW_COUNT 28976
#define SNAT_COUNT (SNAT_HIGH_COUNT + SNAT_LOW_COUNT)
// How many ports a new flow tries before it is dropped (its client
// retries its SYN): with a fraction p of the ports held by live flows, a
// new flow finds none with probability p^SNAT_TRIES (a flood of 20,000
// SYNs a second toward one backend holds about 0.6 of them).
#define SNAT_TRIES 32

#define MAX_FRONTENDS 4096
#define MAX_SLOTS 1048576
#define MAX_OWNERS 65536
#define MAX_RANGES 65536
#define MAX_FLOWS 262144
#define MAX_OPENING 131072

// How long a half-open flow's client may be silent before the flow gives
// its source port to the first new flow that tries it: a flood then holds
// a backend's ports only if it sends more SYNs a second than there are
// ports (SNAT_COUNT). A real client answers within its round trip; one
// whose SYN was not answered retransmits it after 1 s (its retransmission
// then opens a flow of its own).
#define HALF_OPEN_NS 1000000000ULL

// An endpoint: address and port in network order.
struct endpoint {
	__u32 addr;
	__u16 port;
	__u16 pad;
};

struct frontend_key {
	__u32 addr;
	__u16 port;
	__u16 proto;
};

#define FRONTEND_CLIENT_IP 1 // ClientIP affinity: the slot is a hash of the client
#define FRONTEND_RANGES 2    // source ranges: only their clients are forwarded

struct frontend {
	__u32 id;
	__u32 slots;
	__u32 flags;
	__u32 pad;
};

struct slot_key {
	__u32 frontend;
	__u32 slot;
};

struct backend_key {
	__u32 frontend;
	__u32 slot;
	__u32 state;
	__u32 pad;
};

// A source range of a frontend: the LPM key's prefix covers the frontend
// id (32 bits) and the range's prefix.
struct range_key {
	__u32 prefixlen;
	__u32 frontend;
	__u32 addr;
};

// A packet's addresses and ports as it carries them: the client's to a
// frontend (the flows map's key), or a backend's to this host's
// translated source (the replies map's key).
struct tuple {
	__u32 saddr, daddr;
	__u16 sport, dport;
};

#define FLOW_FIN_CLIENT 1 // the client sent a FIN
#define FLOW_FIN_BACKEND 2 // the backend sent a FIN
#define FLOW_RST 4        // either side reset the flow
#define FLOW_ANSWERED 8   // the backend answered
#define FLOW_LOCAL 16     // the backend is this host's: the flow goes through its stack
#define FLOW_OPENING 32   // half-open: the client has not acknowledged the backend's answer
#define FLOW_FIN_BOTH (FLOW_FIN_CLIENT | FLOW_FIN_BACKEND)

struct flow {
	struct endpoint backend;
	// This host's address and port toward the backend; for a FLOW_LOCAL
	// flow, the client's address, and the client's port or, for a port
	// the client used again, another (open).
	struct endpoint source;
	__u64 seen;             // bpf_ktime_get_ns of the last packet
	__u32 flags;
	__u32 out_ifindex; // toward the backend
};

// A flow's client's initial sequence number (its SYN's) is kept in the
// two endpoints' spare halves (backend.pad the high half, source.pad the
// low), so that the flow keeps its layout and an upgrade keeps the flows
// the maps hold. 0: unknown (a flow an older program opened). The halves
// are set in the flow's initializer: a store of 2 bytes into a stack slot
// the compiler reused from a spilled pointer is refused by the verifier
// of a process without CAP_PERFMON (ebb lb's pod has CAP_BPF).
static __always_inline __u32 isn_of(struct flow *f) {
	return ((__u32)f->backend.pad << 16) | f->source.pad;
}

// A flow's replies entry, keyed by the backend's packets' addresses and
// ports: to this host's translated source, or to the client for a
// FLOW_LOCAL flow.
struct reply {
	struct tuple client; // the flow's key
	__u32 in_ifindex;    // toward the client
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FRONTENDS);
	__type(key, struct frontend_key);
	__type(value, struct frontend);
} frontends SEC(".maps");

// homes: frontend . slot -> the owner id of the slot's home backend.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SLOTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct slot_key);
	__type(value, __u32);
} homes SEC(".maps");

// owners: owner id -> 0 while up, 1 while admin Down.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_OWNERS);
	__type(key, __u32);
	__type(value, __u32);
} owners SEC(".maps");

// owner_names: owner id -> the owner's (node's) name. The program does
// not read it: it is how a restarted ebb lb learns the ids its
// predecessor gave the nodes, so that its first change moves no slot.
struct owner_name {
	char name[256];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_OWNERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct owner_name);
} owner_names SEC(".maps");

// backends: frontend . slot . owner state -> backend; no entry: no backend.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SLOTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct backend_key);
	__type(value, struct endpoint);
} backends SEC(".maps");

// turns: a frontend's round-robin counter, by frontend id.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_FRONTENDS);
	__type(key, __u32);
	__type(value, __u32);
} turns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MAX_RANGES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct range_key);
	__type(value, __u32);
} ranges SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct tuple);
	__type(value, struct flow);
} flows SEC(".maps");

// opening: the half-open flows (FLOW_OPENING), keyed as flows is, and
// opening_replies their replies entries. An LRU of their own, so that
// what a SYN flood fills them with evicts only half-open flows (a client
// whose handshake is evicted before the backend answered retransmits its
// SYN; after, its acknowledgement meets the host's stack, which resets
// it). A flow moves to flows and replies at the client's acknowledgement
// of the backend's answer (promote). Flows an older program left
// half-open in flows stay there and open in place.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_OPENING);
	__type(key, struct tuple);
	__type(value, struct flow);
} opening SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_OPENING);
	__type(key, struct tuple);
	__type(value, struct reply);
} opening_replies SEC(".maps");

// stats: counters ebb lb exports, per CPU. STAT_NO_SOURCE_PORT: new
// flows dropped because every source port they tried toward their
// backend was held by a live flow.
#define STAT_NO_SOURCE_PORT 0
#define STATS 1

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STATS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct tuple);
	__type(value, struct reply);
} replies SEC(".maps");

#define IP_OFF ETH_HLEN
#define TCP_OFF (ETH_HLEN + sizeof(struct iphdr))
#define IP_ADDRS_OFF (IP_OFF + __builtin_offsetof(struct iphdr, saddr))
#define IP_TTL_OFF (IP_OFF + __builtin_offsetof(struct iphdr, ttl))
#define IP_CSUM_OFF (IP_OFF + __builtin_offsetof(struct iphdr, check))
#define TCP_CSUM_OFF (TCP_OFF + __builtin_offsetof(struct tcphdr, check))

// IP_MF and IP_OFFSET of the fragment field, in network order.
#define IP_FRAGMENTED __builtin_bswap16(0x3fff)

// parse finds an IPv4 TCP packet without IP options, not a fragment;
// NULL otherwise (the host's stack gets it as it is).
static __always_inline struct iphdr *parse(struct __sk_buff *skb, struct tcphdr **tcp) {
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != __builtin_bswap16(ETH_P_IP))
		return 0;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_TCP || (ip->frag_off & IP_FRAGMENTED))
		return 0;
	struct tcphdr *t = (void *)(ip + 1);
	if ((void *)(t + 1) > end)
		return 0;
	*tcp = t;
	return ip;
}

// rewrite gives the packet, whose addresses and ports are from, those of
// to, and fixes the checksums; with ttl (the packet's TTL, above 1) it
// also lowers the TTL, as a router does. It returns 0, or -1 when the
// packet could not be written.
static __always_inline int rewrite(struct __sk_buff *skb, struct tuple *from, struct tuple *to, __u8 ttl) {
	__be32 old_addrs[2] = {from->saddr, from->daddr};
	__be32 new_addrs[2] = {to->saddr, to->daddr};
	__be32 old_ports = (__u32)from->sport | ((__u32)from->dport << 16);
	__be32 new_ports = (__u32)to->sport | ((__u32)to->dport << 16);
	__s64 addrs = bpf_csum_diff(old_addrs, sizeof(old_addrs), new_addrs, sizeof(new_addrs), 0);
	__s64 ports = bpf_csum_diff(&old_ports, sizeof(old_ports), &new_ports, sizeof(new_ports), 0);
	// The TTL is the first byte of a 16-bit word of the header (with the
	// protocol): its checksum changes by that word's change.
	__u16 old_ttl = (__u16)ttl;
	__u16 new_ttl = (__u16)(ttl - 1);
	__u8 lowered = ttl - 1;
	if (addrs < 0 || ports < 0 ||
	    bpf_skb_store_bytes(skb, IP_ADDRS_OFF, new_addrs, sizeof(new_addrs), 0) < 0 ||
	    bpf_skb_store_bytes(skb, TCP_OFF, &new_ports, sizeof(new_ports), 0) < 0 ||
	    bpf_l3_csum_replace(skb, IP_CSUM_OFF, 0, addrs, 0) < 0 ||
	    bpf_l4_csum_replace(skb, TCP_CSUM_OFF, 0, addrs, BPF_F_PSEUDO_HDR) < 0 ||
	    bpf_l4_csum_replace(skb, TCP_CSUM_OFF, 0, ports, 0) < 0)
		return -1;
	if (ttl && (bpf_skb_store_bytes(skb, IP_TTL_OFF, &lowered, 1, 0) < 0 ||
		    bpf_l3_csum_replace(skb, IP_CSUM_OFF, __builtin_bswap16(old_ttl << 8), __builtin_bswap16(new_ttl << 8), 2) < 0))
		return -1;
	return 0;
}

// translate rewrites the packet from from to to, lowering its TTL ttl,
// and sends it out of ifindex to the next hop the routes give.
static __always_inline int translate(struct __sk_buff *skb, struct tuple *from, struct tuple *to, __u8 ttl, __u32 ifindex) {
	if (rewrite(skb, from, to, ttl) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect_neigh(ifindex, 0, 0, 0);
}

// deliver rewrites the packet from from to to and lets it go on its way
// through the host's stack (a FLOW_LOCAL flow's).
static __always_inline int deliver(struct __sk_buff *skb, struct tuple *from, struct tuple *to) {
	if (rewrite(skb, from, to, 0) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

static __always_inline __u32 mix(__u32 h) {
	h ^= h >> 16;
	h *= 0x7feb352d;
	h ^= h >> 15;
	h *= 0x846ca68b;
	h ^= h >> 16;
	return h;
}

// pick finds the backend of a new flow to fe, or NULL for none.
static __always_inline struct endpoint *pick(struct frontend *fe, __u32 client) {
	if (fe->slots == 0)
		return 0;
	__u32 slot;
	if (fe->flags & FRONTEND_CLIENT_IP) {
		slot = mix(client ^ 0xebb) % fe->slots;
	} else {
		__u32 id = fe->id;
		__u32 *turn = bpf_map_lookup_elem(&turns, &id);
		if (!turn)
			return 0;
		slot = __sync_fetch_and_add(turn, 1) % fe->slots;
	}
	struct slot_key sk = {.frontend = fe->id, .slot = slot};
	__u32 *owner = bpf_map_lookup_elem(&homes, &sk);
	if (!owner)
		return 0;
	__u32 *state = bpf_map_lookup_elem(&owners, owner);
	if (!state)
		return 0;
	struct backend_key bk = {.frontend = fe->id, .slot = slot, .state = *state};
	return bpf_map_lookup_elem(&backends, &bk);
}

// owns reports whether f is the flow whose replies rk keys.
static __always_inline int owns(struct flow *f, struct tuple *rk) {
	return f->source.addr == rk->daddr && f->source.port == rk->dport && f->backend.addr == rk->saddr && f->backend.port == rk->sport;
}

// snat_port is the i-th source port of translated flows, in network
// order.
static __always_inline __u16 snat_port(__u32 i) {
	return __builtin_bswap16(i < SNAT_HIGH_COUNT ? SNAT_HIGH_MIN + i : SNAT_LOW_MIN + (i - SNAT_HIGH_COUNT));
}

// is_snat_port reports whether the port p (host order) is one of
// translated flows.
static __always_inline int is_snat_port(__u16 p) {
	return p >= SNAT_HIGH_MIN || (p >= SNAT_LOW_MIN && p < SNAT_LOW_MIN + SNAT_LOW_COUNT);
}

// count adds one to the counter stat.
static __always_inline void count(__u32 stat) {
	__u64 *n = bpf_map_lookup_elem(&stats, &stat);
	if (n)
		*n += 1;
}

// live reports whether the reply entry r at rk belongs to a flow of the
// table flows_map (flows or opening) that holds its port: one that has
// not ended and is not a half-open flow whose client has been silent for
// HALF_OPEN_NS. A flow that does not is deleted, so that the port's next
// flow can have its entry.
static __always_inline int live(void *flows_map, struct reply *r, struct tuple *rk) {
	struct tuple client = r->client;
	struct flow *f = bpf_map_lookup_elem(flows_map, &client);
	if (!f || !owns(f, rk))
		return 0;
	__u32 flags = f->flags;
	// Signed: another CPU may have stored a later seen since now was read.
	if (!(flags & FLOW_RST) && (flags & FLOW_FIN_BOTH) != FLOW_FIN_BOTH &&
	    !((flags & FLOW_OPENING) && (__s64)(bpf_ktime_get_ns() - f->seen) > (__s64)HALF_OPEN_NS))
		return 1;
	bpf_map_delete_elem(flows_map, &client);
	return 0;
}

// start stores the half-open flow f of the client's packet t, its
// opening_replies entry at rk made; it returns the flow as stored, or
// NULL. An earlier flow of the client's port in flows (one it used
// again) leaves it, so that the port's packets find the new flow; its
// replies entry stays until its port is taken over.
static __always_inline struct flow *start(struct tuple *t, struct flow *f, struct tuple *rk) {
	f->source.port = rk->dport;
	if (bpf_map_update_elem(&opening, t, f, BPF_ANY) < 0) {
		bpf_map_delete_elem(&opening_replies, rk);
		return 0;
	}
	bpf_map_delete_elem(&flows, t);
	return bpf_map_lookup_elem(&opening, t);
}

// same_tuple reports whether a and b are the same addresses and ports.
static __always_inline int same_tuple(struct tuple *a, struct tuple *b) {
	return a->saddr == b->saddr && a->daddr == b->daddr && a->sport == b->sport && a->dport == b->dport;
}

// claim_client_port makes r the entry at rk in opening_replies for a
// FLOW_LOCAL flow, whose replies are keyed by its client's own port: a
// leftover entry of the same client port's (an earlier flow's) is
// replaced, another client flow's (the same client port to another
// frontend with this backend) is not. It reports whether the entry is
// r's.
static __always_inline int claim_client_port(struct tuple *rk, struct reply *r) {
	struct reply *old = bpf_map_lookup_elem(&replies, rk);
	if (old) {
		if (!same_tuple(&old->client, &r->client))
			return 0;
		bpf_map_delete_elem(&replies, rk);
	}
	old = bpf_map_lookup_elem(&opening_replies, rk);
	if (old)
		return same_tuple(&old->client, &r->client) && bpf_map_update_elem(&opening_replies, rk, r, BPF_ANY) == 0;
	return bpf_map_update_elem(&opening_replies, rk, r, BPF_NOEXIST) == 0;
}

// on_free_port stores the flow f of the client's packet t with a source
// port toward its backend that no flow holds, or whose flow has ended
// (the table keeps ended flows until they are evicted or taken over) or
// is half-open with its client silent (live): the first of SNAT_TRIES
// ports chosen by a hash of the client's address and ports. rk is the
// replies entry's key but for the port, r its value. It returns 0 when no
// port could be had, counted in stats. (One pass, taking the first port
// that is free or can be taken over: when a flood holds most ports, the
// free ones are mostly those that connections just closed, whose backend
// may still hold their end in TIME_WAIT and would answer a new SYN on
// them with an acknowledgement of the old connection, which costs the
// client a reset and a retransmitted SYN; most of the flood's stale
// ports have none either (past its SYN queue, a backend answers with SYN
// cookies and keeps nothing). A function of its own, not inlined: inlined in both of
// open's cases, it made the compiler reuse a spilled pointer's stack slot
// for a narrower store, which the verifier of a process without
// CAP_PERFMON refuses.)
static __attribute__((noinline)) int on_free_port(struct tuple *t, struct flow *f, struct tuple *rk, struct reply *r) {
	__u32 h = mix(t->saddr ^ mix(((__u32)t->sport << 16) | t->dport));
	int i;
#pragma unroll
	for (i = 0; i < SNAT_TRIES; i++) {
		rk->dport = snat_port((h + i * 2654435761u) % SNAT_COUNT);
		if (bpf_map_update_elem(&opening_replies, rk, r, BPF_NOEXIST) < 0) {
			struct reply *old = bpf_map_lookup_elem(&opening_replies, rk);
			if (!old || live(&opening, old, rk) || bpf_map_update_elem(&opening_replies, rk, r, BPF_ANY) < 0)
				continue;
		}
		// The port is not taken from an established flow, nor from one
		// promote moved there meanwhile (it writes replies before it
		// deletes from opening_replies, so that one of the two lookups
		// sees it); an ended flow's entry goes.
		struct reply *held = bpf_map_lookup_elem(&replies, rk);
		if (held) {
			if (live(&flows, held, rk)) {
				bpf_map_delete_elem(&opening_replies, rk);
				continue;
			}
			bpf_map_delete_elem(&replies, rk);
		}
		return start(t, f, rk) != 0;
	}
	count(STAT_NO_SOURCE_PORT);
	return 0;
}

// open starts a flow from the client's packet t to the backend be: the
// route to the backend, this host's address on it, a free source port.
// It returns the flow as stored, or NULL when none could be made. again
// says the client's port had a flow before (reused): a flow to a backend
// on this host then gets another source port too, since the host's stack
// may still hold the old connection (kube-proxy's translation of its node
// port to a pod that is gone, in conntrack).
static __always_inline struct flow *open(struct __sk_buff *skb, struct tuple *t, struct endpoint *be, __u32 isn, int again) {
	struct bpf_fib_lookup fib = {
		.family = AF_INET,
		.l4_protocol = IPPROTO_TCP,
		.ifindex = skb->ingress_ifindex,
		.ipv4_src = t->saddr,
		.ipv4_dst = be->addr,
	};
	struct reply r = {.client = *t, .in_ifindex = skb->ingress_ifindex};
	long route = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SRC | BPF_FIB_LOOKUP_SKIP_NEIGH);
	if (route == BPF_FIB_LKUP_RET_NOT_FWDED) {
		// Not forwarded: the backend is an address of this host. The flow
		// keeps the client's address, and its port unless the port had a
		// flow before; its replies are the backend's packets to the
		// client.
		struct flow f = {
			.backend = {.addr = be->addr, .port = be->port, .pad = isn >> 16},
			.source = {.addr = t->saddr, .pad = isn & 0xffff},
			.seen = bpf_ktime_get_ns(),
			.flags = FLOW_LOCAL | FLOW_OPENING,
		};
		struct tuple rk = {.saddr = be->addr, .daddr = t->saddr, .sport = be->port, .dport = t->sport};
		if (again)
			return on_free_port(t, &f, &rk, &r) ? bpf_map_lookup_elem(&opening, t) : 0;
		if (!claim_client_port(&rk, &r))
			return 0;
		return start(t, &f, &rk);
	}
	if (route != BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	struct flow f = {
		.backend = {.addr = be->addr, .port = be->port, .pad = isn >> 16},
		.source = {.addr = fib.ipv4_src, .pad = isn & 0xffff},
		.seen = bpf_ktime_get_ns(),
		.flags = FLOW_OPENING,
		.out_ifindex = fib.ifindex,
	};
	struct tuple rk = {.saddr = be->addr, .daddr = fib.ipv4_src, .sport = be->port};
	return on_free_port(t, &f, &rk, &r) ? bpf_map_lookup_elem(&opening, t) : 0;
}

// ends reports whether the segment tcp is a flow's last, given the
// flow's flags before it: a reset, or the acknowledgement of the second
// FIN.
static __always_inline int ends(struct tcphdr *tcp, __u32 before) {
	return tcp->rst || (tcp->ack && !tcp->fin && !tcp->syn && (before & FLOW_FIN_BOTH) == FLOW_FIN_BOTH);
}

// reply_key is the key of the flow f's replies entry.
static __always_inline struct tuple reply_key(struct flow *f) {
	struct tuple rk = {.saddr = f->backend.addr, .daddr = f->source.addr, .sport = f->backend.port, .dport = f->source.port};
	return rk;
}

// finish deletes the flow f of the client's packets t and its replies
// entry, as its last segment passes (half: from the half-open tables):
// the table keeps live flows only, so that its LRU never evicts an idle
// connection for ended ones. A segment that comes later (a
// retransmission) meets the host's stack, which resets it.
static __always_inline void finish(struct tuple *t, struct flow *f, int half) {
	struct tuple rk = reply_key(f);
	if (half) {
		bpf_map_delete_elem(&opening_replies, &rk);
		bpf_map_delete_elem(&opening, t);
		return;
	}
	bpf_map_delete_elem(&replies, &rk);
	bpf_map_delete_elem(&flows, t);
}

// promote moves the half-open flow f of the client's packets t, whose
// client has acknowledged the backend's answer, to flows and replies, and
// returns it as stored there; NULL when it is no longer the owner of its
// port (it was taken over) or could not be stored. (A flag another CPU
// sets on the half-open copy while it moves is lost: at worst a FIN, and
// the flow is then left to the sweeper's idle timeout.)
static __attribute__((noinline)) struct flow *promote(struct tuple *t, struct flow *f) {
	struct flow open = *f;
	open.flags &= ~FLOW_OPENING;
	struct tuple rk = reply_key(f);
	struct reply *r = bpf_map_lookup_elem(&opening_replies, &rk);
	if (!r)
		// Another CPU moved it a moment ago (the client's acknowledgement
		// and its first data on two CPUs): flows has it already.
		return bpf_map_lookup_elem(&flows, t);
	struct reply rv = *r;
	if (!same_tuple(&rv.client, t))
		return 0;
	// The flow first: a backend's packet in between finds the port in
	// opening_replies still, and its flow in opening.
	if (bpf_map_update_elem(&flows, t, &open, BPF_ANY) < 0)
		return 0;
	if (bpf_map_update_elem(&replies, &rk, &rv, BPF_ANY) < 0) {
		bpf_map_delete_elem(&flows, t);
		return 0;
	}
	bpf_map_delete_elem(&opening_replies, &rk);
	bpf_map_delete_elem(&opening, t);
	return bpf_map_lookup_elem(&flows, t);
}

// find looks the flow of the client's packets t up, in flows and then in
// opening (half says which).
static __always_inline struct flow *find(struct tuple *t, int *half) {
	struct flow *f = bpf_map_lookup_elem(&flows, t);
	*half = 0;
	if (f)
		return f;
	*half = 1;
	return bpf_map_lookup_elem(&opening, t);
}

// reused reports whether the client's SYN tcp, which found the flow f
// under its addresses and ports, opens a new connection rather than
// retrying f's: f ended (the client reset or closed it), or the SYN's
// sequence number is not f's. The second matters when this host never
// saw f end (its last segments went through another LB host, or were
// lost) and the client reuses its port: f would take the new connection
// to f's backend, which may be gone (the node port of a deleted Service
// whose address a new one took: a refused connection).
//
// A FLOW_LOCAL flow's replies entry is keyed by the client's port; the
// new flow gets another port (open), so the old entry stays until the
// sweeper or the LRU takes it. (Deleting it here, with the flow, made the
// compiler spill registers in a way the verifier of a process without
// CAP_PERFMON refuses: "attempt to corrupt spilled pointer on stack".)
static __always_inline int reused(struct flow *f, struct tcphdr *tcp) {
	if (f->flags & (FLOW_RST | FLOW_FIN_CLIENT))
		return 1;
	__u32 isn = isn_of(f);
	return isn != 0 && isn != __builtin_bswap32(tcp->seq);
}

// NEW_FLOW is new_flow's result when it opened a flow.
#define NEW_FLOW -1

// new_flow opens a flow for the client's SYN t to a frontend (its initial
// sequence number isn; again: its port had a flow before), and returns
// NEW_FLOW, or the verdict for the SYN when it opened none: on to the
// host's stack (outside the source ranges, no backend), or dropped. (A
// function of its own, not inlined, which looks the frontend up again:
// otherwise the frontend's pointer is spilled across to_backend's calls,
// and the compiler reuses its stack slot for a narrower value on the path
// of a known flow, which the verifier of a process without CAP_PERFMON
// refuses: "attempt to corrupt spilled pointer on stack".)
static __attribute__((noinline)) int new_flow(struct __sk_buff *skb, struct tuple *t, __u32 isn, int again) {
	struct frontend_key fk = {.addr = t->daddr, .port = t->dport, .proto = IPPROTO_TCP};
	struct frontend *fe = bpf_map_lookup_elem(&frontends, &fk);
	if (!fe)
		return TC_ACT_OK;
	if (fe->flags & FRONTEND_RANGES) {
		struct range_key rk = {.prefixlen = 64, .frontend = fe->id, .addr = t->saddr};
		if (!bpf_map_lookup_elem(&ranges, &rk))
			return TC_ACT_OK;
	}
	struct endpoint *be = pick(fe, t->saddr);
	if (!be)
		return TC_ACT_OK;
	return open(skb, t, be, isn, again) ? NEW_FLOW : TC_ACT_SHOT;
}

// to_backend forwards a client's packet to a frontend.
static __always_inline int to_backend(struct __sk_buff *skb, struct iphdr *ip, struct tcphdr *tcp) {
	struct tuple t = {.saddr = ip->saddr, .daddr = ip->daddr, .sport = tcp->source, .dport = tcp->dest};
	__u8 ttl = ip->ttl;
	int syn = tcp->syn && !tcp->ack;
	__u32 seg = (tcp->fin ? FLOW_FIN_CLIENT : 0) | (tcp->rst ? FLOW_RST : 0);
	int half;
	struct flow *f = find(&t, &half);
	int again = f && syn && reused(f, tcp);
	if (!f || again) {
		// The client's port is used again (again): a new flow. The old
		// one keeps its replies entry until its port is taken over, so
		// that the new flow gets another source port toward the backends
		// (the old one may still be open at a backend that never saw its
		// end).
		if (!syn)
			return TC_ACT_OK;
		int verdict = new_flow(skb, &t, __builtin_bswap32(tcp->seq), again);
		if (verdict != NEW_FLOW)
			return verdict;
		f = bpf_map_lookup_elem(&opening, &t);
		if (!f)
			return TC_ACT_SHOT;
		half = 1;
	}
	if (ttl <= 1)
		return TC_ACT_OK; // the stack answers with time exceeded
	f->seen = bpf_ktime_get_ns();
	__u32 before = f->flags;
	if (seg && (before & seg) != seg)
		__sync_fetch_and_or(&f->flags, seg);
	// The client's acknowledgement of the backend's answer: the flow is
	// open (one an older program left in flows opens in place).
	if ((before & (FLOW_OPENING | FLOW_ANSWERED)) == (FLOW_OPENING | FLOW_ANSWERED) && tcp->ack && !tcp->syn) {
		if (half) {
			f = promote(&t, f);
			if (!f)
				return TC_ACT_OK; // its port was taken over: the stack resets it
			half = 0;
		} else {
			__sync_fetch_and_and(&f->flags, ~FLOW_OPENING);
		}
	}
	struct tuple to = {.saddr = f->source.addr, .daddr = f->backend.addr, .sport = f->source.port, .dport = f->backend.port};
	__u32 ifindex = f->out_ifindex;
	__u32 local = before & FLOW_LOCAL;
	if (ends(tcp, before))
		finish(&t, f, half);
	if (local)
		return deliver(skb, &t, &to);
	return translate(skb, &t, &to, ttl, ifindex);
}

// backend_segment records a backend's segment tcp in its flow f (keyed by
// client): answered, its FIN or reset, the flow's end; and returns the
// addresses and ports it goes back to the client with. A half-open flow's
// time is the client's: the backend's retransmitted answers do not keep
// it.
static __always_inline struct tuple backend_segment(struct tcphdr *tcp, struct tuple *client, struct flow *f, int half) {
	__u32 seg = FLOW_ANSWERED | (tcp->fin ? FLOW_FIN_BACKEND : 0) | (tcp->rst ? FLOW_RST : 0);
	__u32 before = f->flags;
	if (!(before & FLOW_OPENING))
		f->seen = bpf_ktime_get_ns();
	if ((before & seg) != seg)
		__sync_fetch_and_or(&f->flags, seg);
	if (ends(tcp, before))
		finish(client, f, half);
	struct tuple to = {.saddr = client->daddr, .daddr = client->saddr, .sport = client->dport, .dport = client->sport};
	return to;
}

// reply_of looks up the replies entry at t (a backend's packet's
// addresses and ports): in replies, or in opening_replies (half is then
// set). A port is in one of them at a time (on_free_port,
// claim_client_port), but for the moment promote moves it.
static __always_inline struct reply *reply_of(struct tuple *t, int *half) {
	*half = 0;
	struct reply *r = bpf_map_lookup_elem(&replies, t);
	if (r)
		return r;
	*half = 1;
	return bpf_map_lookup_elem(&opening_replies, t);
}

// flow_of looks up the flow of client's packets, in opening when half.
static __always_inline struct flow *flow_of(struct tuple *client, int half) {
	if (half)
		return bpf_map_lookup_elem(&opening, client);
	return bpf_map_lookup_elem(&flows, client);
}

// to_client forwards a backend's packet, whose addresses and ports are t
// and whose replies entry is r (in opening_replies when half), to its
// flow's client.
static __always_inline int to_client(struct __sk_buff *skb, struct iphdr *ip, struct tcphdr *tcp, struct tuple *t, struct reply *r, int half) {
	__u8 ttl = ip->ttl;
	if (ttl <= 1)
		return TC_ACT_OK;
	struct tuple client = r->client;
	__u32 ifindex = r->in_ifindex;
	struct flow *f = flow_of(&client, half);
	if (!f || !owns(f, t) || (f->flags & FLOW_LOCAL))
		return TC_ACT_OK; // a stale entry: the flow is gone or has another port now
	struct tuple to = backend_segment(tcp, &client, f, half);
	return translate(skb, t, &to, ttl, ifindex);
}

SEC("tc")
int ebb_ingress(struct __sk_buff *skb) {
	struct tcphdr *tcp;
	struct iphdr *ip = parse(skb, &tcp);
	if (!ip)
		return TC_ACT_OK;
	struct tuple t = {.saddr = ip->saddr, .daddr = ip->daddr, .sport = tcp->source, .dport = tcp->dest};
	if (is_snat_port(__builtin_bswap16(t.dport))) {
		int half;
		struct reply *r = reply_of(&t, &half);
		if (r)
			return to_client(skb, ip, tcp, &t, r, half);
	}
	struct frontend_key fk = {.addr = t.daddr, .port = t.dport, .proto = IPPROTO_TCP};
	if (!bpf_map_lookup_elem(&frontends, &fk))
		return TC_ACT_OK;
	return to_backend(skb, ip, tcp);
}

// ebb_egress gives the replies of FLOW_LOCAL flows, which the host's stack
// sends from the backend's address (this host's) to the client, the
// frontend's address and port back. Every other packet goes out as it is.
SEC("tc")
int ebb_egress(struct __sk_buff *skb) {
	struct tcphdr *tcp;
	struct iphdr *ip = parse(skb, &tcp);
	if (!ip)
		return TC_ACT_OK;
	struct tuple t = {.saddr = ip->saddr, .daddr = ip->daddr, .sport = tcp->source, .dport = tcp->dest};
	int half;
	struct reply *r = reply_of(&t, &half);
	if (!r)
		return TC_ACT_OK;
	struct tuple client = r->client;
	struct flow *f = flow_of(&client, half);
	if (!f || !(f->flags & FLOW_LOCAL) || !owns(f, &t))
		return TC_ACT_OK;
	struct tuple to = backend_segment(tcp, &client, f, half);
	return deliver(skb, &t, &to);
}

char LICENSE[] SEC("license") = "GPL";
