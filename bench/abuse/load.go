package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebbdev/ebb/internal/localcluster/network"
)

// serveBackends runs the backends on their host: TCP port 8080 answers
// "ok" and closes, UDP port 5353 echoes.
func serveBackends(h *network.Host) (stop func(), err error) {
	ln, err := h.Listen("tcp", "10.78.2.2:8080")
	if err != nil {
		return nil, err
	}
	pc, err := h.ListenPacket("udp", "10.78.2.2:5353")
	if err != nil {
		ln.Close()
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.WriteString(c, "ok"); c.Close() }()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	return func() { ln.Close(); pc.Close() }, nil
}

// The TCP frontends: the proxy's, and the eBPF kernel path's.
const (
	proxyFrontend = "10.78.9.1:80"
	ebpfFrontend  = "10.78.9.1:81"
)

// request opens one connection to the TCP frontend at addr and reads the
// answer.
func request(ctx context.Context, client *network.Host, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := client.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if string(b) != "ok" {
		return fmt.Errorf("answer %q", b)
	}
	return nil
}

// waitServing waits until the TCP frontend at addr answers.
func waitServing(ctx context.Context, client *network.Host, addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := request(ctx, client, addr)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ebb lb does not serve %s after 30 s: %w", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// legitRate is the rate of successful new connections to the TCP
// frontend at addr 8 workers make for d.
func legitRate(ctx context.Context, client *network.Host, addr string, d time.Duration) float64 {
	var ok atomic.Int64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				if request(ctx, client, addr) == nil {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(ok.Load()) / d.Seconds()
}

// floodResult is what the UDP flood cost.
type floodResult struct {
	// cpu is ebb lb's CPU (cores) while legitimate clients connected.
	legitRate, maxRSS, cpu float64
	sent                   int64
}

// udpFlood sends rate datagrams a second to the UDP frontend for d, each
// from the next source port of the client's address (a raw socket builds
// them), while legitimate clients keep connecting and ebb lb's memory is
// sampled.
func udpFlood(ctx context.Context, h *hosts, pid, rate int, d time.Duration) (floodResult, error) {
	var fd int
	err := h.client.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		return err
	})
	if err != nil {
		return floodResult{}, fmt.Errorf("opening a raw socket: %w", err)
	}
	defer unix.Close(fd)
	var res floodResult
	var sent atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		sendFlood(fd, rate, stop, &sent)
	}()
	var rss float64
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				rss = max(rss, rssMiB(pid))
			}
		}
	}()
	// The flows pile up for the idle timeout: the legitimate rate is
	// measured over the flood's second half, when they are most.
	time.Sleep(d / 2)
	cpu := cpuSeconds(pid)
	res.legitRate = legitRate(ctx, h.client, proxyFrontend, d/2)
	res.cpu = (cpuSeconds(pid) - cpu) / (d / 2).Seconds()
	close(stop)
	wg.Wait()
	res.maxRSS, res.sent = rss, sent.Load()
	return res, nil
}

// sendFlood sends rate datagrams a second until stop, in batches every
// 10 ms, each from the next source port.
func sendFlood(fd, rate int, stop <-chan struct{}, sent *atomic.Int64) {
	to := &unix.SockaddrInet4{Addr: [4]byte{10, 78, 9, 1}}
	pkt := make([]byte, 20+8+4)
	pkt[0], pkt[8], pkt[9] = 0x45, 64, unix.IPPROTO_UDP
	copy(pkt[12:16], []byte{10, 78, 1, 2})
	copy(pkt[16:20], []byte{10, 78, 9, 1})
	binary.BigEndian.PutUint16(pkt[22:24], 53)
	binary.BigEndian.PutUint16(pkt[24:26], 8+4)
	copy(pkt[28:], "ping")
	port := uint16(1024)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	per := max(rate/100, 1)
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for range per {
			binary.BigEndian.PutUint16(pkt[20:22], port)
			if port++; port == 0 {
				port = 1024
			}
			if unix.Sendto(fd, pkt, 0, to) == nil {
				sent.Add(1)
			}
		}
	}
}

// rssMiB is the process's resident memory.
func rssMiB(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// cpuSeconds is the CPU time (user and system) the process used so far.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: utime and
	// stime are the 12th and 13th, in clock ticks (100 a second).
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	user, _ := strconv.ParseFloat(fields[11], 64)
	sys, _ := strconv.ParseFloat(fields[12], 64)
	return (user + sys) / 100
}

// lbMetrics reads ebb lb's metrics on its host's loopback.
func lbMetrics(lb *network.Host) string {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return lb.DialContext(ctx, network, addr)
	}}}
	resp, err := client.Get("http://127.0.0.1:9464/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
