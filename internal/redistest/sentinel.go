package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MasterName is the name under which the sentinels of StartSentinel monitor
// their master, the MasterName of a go-redis failover client.
const MasterName = "hybrid"

const (
	// sentinelReplicas is the number of replicas of the master.
	sentinelReplicas = 2
	// sentinelCount is the number of sentinels.
	sentinelCount = 3
	// sentinelQuorum is how many sentinels must agree the master is down.
	sentinelQuorum = 2
	// defaultDownAfter is the default SentinelOptions.DownAfter.
	defaultDownAfter = time.Second
	// defaultFailoverTimeout is the default SentinelOptions.FailoverTimeout.
	defaultFailoverTimeout = 5 * time.Second
	// sentinelConfName is a sentinel's configuration file, in its directory.
	sentinelConfName = "sentinel.conf"
	// commandTimeout bounds a command that is not a readiness probe.
	commandTimeout = 5 * time.Second
	// tiltPeriod is how long a sentinel stays in TILT mode, in which it
	// acts on nothing (no failover), after its timer ran more than 2 s
	// late: a process starved that long on loaded cores. Sentinel's own
	// 30 s outlasts WaitFailover's timeouts; set with SENTINEL DEBUG
	// (Redis 7.0 and later), and left at 30 s by an older sentinel.
	tiltPeriod = 2 * time.Second
)

// SentinelOptions configures StartSentinel. A zero field means its default.
type SentinelOptions struct {
	Args            []string      // extra redis-server arguments for the master and the replicas
	DownAfter       time.Duration // sentinel down-after-milliseconds; 0 means 1 s
	FailoverTimeout time.Duration // sentinel failover-timeout; 0 means 5 s
}

// SentinelProc is a master with two replicas, monitored as MasterName by
// three Redis Sentinels, all on 127.0.0.1. Create one with StartSentinel;
// the zero value is not usable. Its methods are safe for concurrent use.
type SentinelProc struct {
	nodes     []*Proc // master first, then replicas, as started
	sentinels []*Proc

	mu      sync.Mutex // protects stopped
	stopped bool
}

// StartSentinel starts a master and two replicas without persistence and
// with repl-diskless-sync-delay 0 before opts.Args (Start, with --replicaof
// for the replicas), waits until the master reports both replicas online,
// then starts three sentinels that monitor the master as MasterName with a
// quorum of 2, and waits until every sentinel reports it ok with 2 replicas
// and 3 sentinels. Sentinels run redis-sentinel if it is
// on PATH, else redis-server --sentinel, with their TILT period 2 s rather
// than 30 s (see tiltPeriod). The caller must call Stop.
//
// Measured on 2 cores (Redis 7.0): it takes about 2.3 s, nearly all of it the
// sentinels finding each other through the hello messages they publish every
// 2 s. With the default DownAfter, WaitFailover returns about 3.3 s after the
// master is killed, and about 1.2 s after a Failover.
func StartSentinel(opts SentinelOptions) (*SentinelProc, error) {
	downAfter, failoverTimeout := opts.DownAfter, opts.FailoverTimeout
	if downAfter == 0 {
		downAfter = defaultDownAfter
	}
	if failoverTimeout == 0 {
		failoverTimeout = defaultFailoverTimeout
	}
	if downAfter < time.Millisecond || failoverTimeout < time.Millisecond {
		return nil, fmt.Errorf("redistest: DownAfter %v and FailoverTimeout %v must be at least 1ms", opts.DownAfter, opts.FailoverTimeout)
	}
	bin, flags, err := sentinelCommand()
	if err != nil {
		return nil, err
	}

	// A master waits repl-diskless-sync-delay (5 s by default) for more
	// replicas before it sends its first full sync; a replica promoted by a
	// failover is a master too.
	args := append([]string{"--repl-diskless-sync-delay", "0"}, opts.Args...)
	s := &SentinelProc{}
	master, err := start(Options{Args: args}, freePort)
	if err != nil {
		return nil, err
	}
	s.nodes = append(s.nodes, master)
	_, masterPort, err := net.SplitHostPort(master.addr)
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("redistest: %w", err)
	}
	replicaArgs := append([]string{"--replicaof", "127.0.0.1", masterPort}, args...)
	for range sentinelReplicas {
		p, err := start(Options{Args: replicaArgs}, freePort)
		if err != nil {
			s.Stop()
			return nil, err
		}
		s.nodes = append(s.nodes, p)
	}
	if err := s.waitReplicas(); err != nil {
		s.Stop()
		return nil, err
	}

	monitor := []string{
		"sentinel resolve-hostnames no",
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %s %d", MasterName, masterPort, sentinelQuorum),
		fmt.Sprintf("sentinel down-after-milliseconds %s %d", MasterName, downAfter.Milliseconds()),
		fmt.Sprintf("sentinel failover-timeout %s %d", MasterName, failoverTimeout.Milliseconds()),
		fmt.Sprintf("sentinel parallel-syncs %s 1", MasterName),
	}
	for range sentinelCount {
		p, err := startSentinelProc(bin, flags, monitor)
		if err != nil {
			s.Stop()
			return nil, err
		}
		s.sentinels = append(s.sentinels, p)
	}
	if err := s.waitMonitored(); err != nil {
		s.Stop()
		return nil, err
	}
	for _, p := range s.sentinels {
		if err := shortTilt(p.addr); err != nil {
			s.Stop()
			return nil, err
		}
	}
	return s, nil
}

// shortTilt sets the TILT period of the sentinel at addr to tiltPeriod, if
// it knows SENTINEL DEBUG.
func shortTilt(addr string) error {
	_, err := command(addr, commandTimeout, "SENTINEL", "DEBUG", "tilt-period", strconv.FormatInt(tiltPeriod.Milliseconds(), 10))
	if err != nil && !strings.HasPrefix(err.Error(), "ERR ") {
		return fmt.Errorf("redistest: SENTINEL DEBUG tilt-period on %s: %w", addr, err)
	}
	return nil
}

// sentinelCommand returns the binary that runs a sentinel and the flags that
// follow its configuration file: redis-sentinel alone, or redis-server with
// --sentinel.
func sentinelCommand() (string, []string, error) {
	if bin, err := exec.LookPath("redis-sentinel"); err == nil {
		return bin, nil, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, fmt.Errorf("redistest: %w", err)
	}
	return bin, []string{"--sentinel"}, nil
}

// startSentinelProc starts a sentinel on a free loopback port with a
// configuration file of its own, in a fresh temporary directory (a sentinel
// rewrites its file), holding the lines monitor after the basic ones, and
// waits until it answers. It retries on other ports if a port turns out to
// be taken.
func startSentinelProc(bin string, flags, monitor []string) (*Proc, error) {
	dir, err := os.MkdirTemp("", "redistest-sentinel-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redistest: %w", err)
	}
	conf := filepath.Join(dir, sentinelConfName)
	for range startAttempts {
		var port int
		if port, err = freePort(); err != nil {
			break
		}
		lines := append([]string{
			"port " + strconv.Itoa(port),
			"bind 127.0.0.1",
			"daemonize no",
			"dir " + confQuote(dir),
			`logfile ""`,
		}, monitor...)
		if err = os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			err = fmt.Errorf("redistest: %w", err)
			break
		}
		p := &Proc{
			addr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			owned: true,
			bin:   bin,
			args:  append([]string{conf}, flags...),
			dir:   dir,
			rmDir: true,
		}
		if err = p.launch(); err == nil {
			return p, nil
		}
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

// confQuote quotes s for a Redis configuration file, as a double-quoted
// string with every byte that is not printable ASCII, a quote or a backslash
// written as \xHH.
func confQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '"' || c == '\\' {
			fmt.Fprintf(&b, `\x%02x`, c)
		} else {
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// waitReplicas polls INFO replication on the master until it reports every
// replica connected and online, or 30 s pass.
func (s *SentinelProc) waitReplicas() error {
	master := s.nodes[0]
	want := make(map[string]bool)
	for _, p := range s.nodes[1:] {
		_, port, _ := net.SplitHostPort(p.addr)
		want[port] = true
	}
	deadline := time.Now().Add(clusterTimeout)
	for {
		info, err := command(master.addr, probeTimeout, "INFO", "replication")
		if err == nil {
			if err = replicasOnline(info, want); err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: replicas of %s after %v: %w", master.addr, clusterTimeout, err)
		}
		time.Sleep(10 * pollInterval)
	}
}

// replicasOnline returns an error unless the INFO replication reply info
// lists exactly the replicas whose ports are keys of ports, each online.
func replicasOnline(info string, ports map[string]bool) error {
	if v, _ := infoValue(info, "connected_slaves"); v != strconv.Itoa(len(ports)) {
		return errors.New("not ready:\n" + strings.TrimSpace(info))
	}
	for i := range len(ports) {
		v, _ := infoValue(info, "slave"+strconv.Itoa(i))
		f := infoFields(v)
		if f["ip"] != "127.0.0.1" || !ports[f["port"]] || f["state"] != "online" {
			return errors.New("not ready:\n" + strings.TrimSpace(info))
		}
	}
	return nil
}

// waitMonitored polls INFO sentinel on every sentinel until each reports
// the master ok at its address with every replica and every sentinel, or
// 30 s pass.
func (s *SentinelProc) waitMonitored() error {
	deadline := time.Now().Add(clusterTimeout)
	want := map[string]string{
		"status":    "ok",
		"address":   s.nodes[0].addr,
		"slaves":    strconv.Itoa(len(s.nodes) - 1),
		"sentinels": strconv.Itoa(len(s.sentinels)),
	}
	for _, p := range s.sentinels {
		for {
			m, err := sentinelMaster(p.addr)
			if err == nil {
				for k, v := range want {
					if m[k] != v {
						err = fmt.Errorf("not ready: %s=%s, want %s", k, m[k], v)
						break
					}
				}
				if err == nil {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redistest: sentinel %s after %v: %w", p.addr, clusterTimeout, err)
			}
			time.Sleep(10 * pollInterval)
		}
	}
	return nil
}

// sentinelMaster asks the sentinel at addr for INFO sentinel and returns the
// fields of its line for MasterName, such as status, address, slaves and
// sentinels.
func sentinelMaster(addr string) (map[string]string, error) {
	info, err := command(addr, probeTimeout, "INFO", "sentinel")
	if err != nil {
		return nil, err
	}
	for line := range strings.Lines(info) {
		key, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":")
		if !ok || !strings.HasPrefix(key, "master") {
			continue
		}
		if f := infoFields(v); f["name"] == MasterName {
			return f, nil
		}
	}
	return nil, fmt.Errorf("INFO sentinel names no master %s:\n%s", MasterName, strings.TrimSpace(info))
}

// infoValue returns the value of the line "key:value" of an INFO reply.
func infoValue(info, key string) (string, bool) {
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":"); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// infoFields splits an INFO value "a=1,b=2" into its fields.
func infoFields(v string) map[string]string {
	f := make(map[string]string)
	for _, kv := range strings.Split(v, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			f[k] = v
		}
	}
	return f
}

// SentinelAddrs returns the addresses of the sentinels, "127.0.0.1:port".
func (s *SentinelProc) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, p := range s.sentinels {
		addrs[i] = p.addr
	}
	return addrs
}

// Sentinels returns the sentinels' processes, to freeze one as a loaded
// machine would.
func (s *SentinelProc) Sentinels() []*Proc { return append([]*Proc(nil), s.sentinels...) }

// Nodes returns the data nodes, master first, then the replicas, in the
// order they were started. Which of them is the master changes with each
// failover: ask Master.
func (s *SentinelProc) Nodes() []*Proc {
	return append([]*Proc(nil), s.nodes...)
}

// MasterAddr returns the master's address as the first sentinel that
// answers reports it in INFO sentinel. During a failover the sentinels may
// disagree; WaitFailover waits until they do not.
func (s *SentinelProc) MasterAddr() (string, error) {
	var errs []error
	for _, p := range s.sentinels {
		m, err := sentinelMaster(p.addr)
		if err == nil {
			if err = CheckLoopback(m["address"]); err == nil {
				return m["address"], nil
			}
		}
		errs = append(errs, fmt.Errorf("sentinel %s: %w", p.addr, err))
	}
	return "", fmt.Errorf("redistest: no sentinel names the master: %w", errors.Join(errs...))
}

// Master returns the node that MasterAddr names.
func (s *SentinelProc) Master() (*Proc, error) {
	addr, err := s.MasterAddr()
	if err != nil {
		return nil, err
	}
	for _, p := range s.nodes {
		if p.addr == addr {
			return p, nil
		}
	}
	return nil, fmt.Errorf("redistest: master %s is not among the nodes %v", addr, s.addrs())
}

// addrs returns the addresses of the data nodes.
func (s *SentinelProc) addrs() []string {
	addrs := make([]string, len(s.nodes))
	for i, p := range s.nodes {
		addrs[i] = p.addr
	}
	return addrs
}

// WaitFailover polls the sentinels until every one of them names the same
// master, at an address other than old, and that server reports
// role:master in INFO replication, or timeout passes. It returns the new
// master's address; its error after timeout ends with the end of each
// sentinel's log (why no failover came: a vote lost, no good replica). The sentinel that led the failover names the new master
// only once the failover is over.
func (s *SentinelProc) WaitFailover(old string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		addr, err := s.failedOver(old)
		if err == nil {
			return addr, nil
		}
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, p := range s.sentinels {
				fmt.Fprintf(&logs, "\nsentinel %s's log ends with:\n%s", p.addr, logTail(filepath.Join(p.dir, logName), 0))
			}
			return "", fmt.Errorf("redistest: failover from %s after %v: %w%s", old, timeout, err, logs.String())
		}
		time.Sleep(10 * pollInterval)
	}
}

// failedOver returns the master every sentinel names if it is not old and
// reports role:master, else an error that says what is missing.
func (s *SentinelProc) failedOver(old string) (string, error) {
	addr := ""
	for _, p := range s.sentinels {
		m, err := sentinelMaster(p.addr)
		if err != nil {
			return "", fmt.Errorf("sentinel %s: %w", p.addr, err)
		}
		switch a := m["address"]; {
		case a == old:
			return "", fmt.Errorf("sentinel %s still names %s", p.addr, old)
		case addr == "":
			addr = a
		case a != addr:
			return "", fmt.Errorf("sentinels name %s and %s", addr, a)
		}
	}
	info, err := command(addr, probeTimeout, "INFO", "replication")
	if err != nil {
		return "", fmt.Errorf("new master %s: %w", addr, err)
	}
	if role, _ := infoValue(info, "role"); role != "master" {
		return "", fmt.Errorf("new master %s reports role:%s", addr, role)
	}
	return addr, nil
}

// Failover asks the first sentinel to fail over now, with SENTINEL FAILOVER,
// without waiting for the master to be down or for the other sentinels to
// agree, and returns once the sentinel has accepted (+OK); WaitFailover
// waits for the new master. A sentinel refuses while a failover is under way
// (-INPROG) or while it knows no replica that is connected and has answered
// INFO lately (-NOGOODSLAVE), as for some 50 ms after WaitFailover returns:
// Failover asks again until it accepts, for at most 30 s.
func (s *SentinelProc) Failover() error {
	addr := s.sentinels[0].addr
	deadline := time.Now().Add(clusterTimeout)
	for {
		reply, err := command(addr, commandTimeout, "SENTINEL", "FAILOVER", MasterName)
		if err == nil && reply != "OK" {
			err = fmt.Errorf("reply %q, want OK", reply)
		}
		if err == nil {
			return nil
		}
		if !refusedFailover(err) || time.Now().After(deadline) {
			return fmt.Errorf("redistest: SENTINEL FAILOVER %s on %s: %w", MasterName, addr, err)
		}
		time.Sleep(10 * pollInterval)
	}
}

// refusedFailover reports whether err is a sentinel's error reply to
// SENTINEL FAILOVER that says to ask again later.
func refusedFailover(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "NOGOODSLAVE ") || strings.HasPrefix(msg, "INPROG ")
}

// Stop stops the sentinels, then the data nodes, and removes their
// directories. Stopping twice does nothing.
func (s *SentinelProc) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	var errs []error
	for _, p := range s.sentinels {
		errs = append(errs, p.Stop())
	}
	for _, p := range s.nodes {
		errs = append(errs, p.Stop())
	}
	return errors.Join(errs...)
}
