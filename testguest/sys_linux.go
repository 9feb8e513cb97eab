//go:build linux

package main

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// defaultModules is the load order used when /etc/testguest/modules is absent.
// virtio net needs the order TESTHOST.md gives; isofs needs cdrom first.
var defaultModules = []string{
	"virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci",
	"failover", "net_failover", "virtio_net",
	"virtio_console", "virtio_blk", "cdrom", "isofs",
}

// mountBase mounts proc, sysfs, devtmpfs and a tmpfs on /run and /tmp.
func mountBase(logger *log.Logger) {
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/run", "tmpfs"},
		{"tmpfs", "/tmp", "tmpfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := syscall.Mount(m.src, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, syscall.EBUSY) {
			logger.Printf("init: mount %s: %v", m.dst, err)
		}
	}
	os.MkdirAll("/dev/pts", 0o755)
	syscall.Mount("devpts", "/dev/pts", "devpts", 0, "")
}

// useConsole points stdout and stderr at /dev/console (ttyS0 with console=ttyS0).
func useConsole() {
	f, err := os.OpenFile("/dev/console", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return
	}
	syscall.Dup3(int(f.Fd()), 1, 0)
	syscall.Dup3(int(f.Fd()), 2, 0)
}

// moduleList reads the load order written by the build script.
func moduleList(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return defaultModules
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// loadModules loads dir/NAME.ko for each name in order; a missing file or an
// already loaded module is not an error.
func loadModules(dir string, names []string, logger *log.Logger) {
	empty := []byte{0}
	for _, n := range names {
		p := filepath.Join(dir, n+".ko")
		f, err := os.Open(p)
		if err != nil {
			logger.Printf("init: module %s: %v", n, err)
			continue
		}
		_, _, errno := syscall.Syscall(sysFinitModule, f.Fd(), uintptr(unsafe.Pointer(&empty[0])), 0)
		f.Close()
		if errno != 0 && errno != syscall.EEXIST {
			logger.Printf("init: load %s: %v", n, errno)
			continue
		}
	}
	logger.Printf("init: modules loaded: %s", strings.Join(names, " "))
}

// ifUp sets IFF_UP on an interface.
func ifUp(name string) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	var ifr [40]byte
	copy(ifr[:16], name)
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCGIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return e
	}
	flags := *(*uint16)(unsafe.Pointer(&ifr[16]))
	flags |= syscall.IFF_UP
	*(*uint16)(unsafe.Pointer(&ifr[16])) = flags
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return e
	}
	return nil
}

// shutdown syncs and powers off (or reboots) the VM after a short pause so
// the caller's log line reaches the console.
func shutdown(mode string, logger *log.Logger) {
	logger.Printf("agent: guest-shutdown %s", mode)
	go func() {
		time.Sleep(200 * time.Millisecond)
		syscall.Sync()
		cmd := syscall.LINUX_REBOOT_CMD_POWER_OFF
		switch mode {
		case "reboot":
			cmd = syscall.LINUX_REBOOT_CMD_RESTART
		case "halt":
			cmd = syscall.LINUX_REBOOT_CMD_HALT
		}
		if err := syscall.Reboot(cmd); err != nil {
			logger.Printf("agent: reboot(%s): %v", mode, err)
		}
	}()
}

func setHostname(name string) error { return syscall.Sethostname([]byte(name)) }

// waitFor polls cond every 100 ms until it is true or d has passed.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reaper collects every child (as PID 1 we inherit orphans) and tells
// registered waiters when their process exits.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan syscall.WaitStatus{}}
	go r.loop()
	return r
}

func (r *reaper) loop() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err != nil {
			if err == syscall.EINTR {
				continue
			}
			time.Sleep(200 * time.Millisecond) // ECHILD: nothing to wait for yet
			continue
		}
		r.mu.Lock()
		ch := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ch != nil {
			ch <- ws
		}
	}
}

// start runs argv with stdout/stderr to the console and returns a channel
// that receives its exit status.
func (r *reaper) start(argv []string, env []string) (int, <-chan syscall.WaitStatus, error) {
	ch := make(chan syscall.WaitStatus, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{
		Env:   env,
		Files: []uintptr{0, 1, 2},
	})
	if err != nil {
		return 0, nil, err
	}
	r.waiters[pid] = ch
	return pid, ch, nil
}

// runDHCP keeps busybox udhcpc running in the foreground on iface until
// stop is closed (nil: for ever); then it stops udhcpc and returns.
func runDHCP(r *reaper, udhcpc, script, iface string, stop <-chan struct{}, logger *log.Logger) {
	for {
		argv := []string{udhcpc, "-f", "-i", iface, "-s", script, "-t", "10", "-T", "1", "-A", "2"}
		pid, ch, err := r.start(argv, []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"})
		if err != nil {
			logger.Printf("dhcp: start %s: %v", udhcpc, err)
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Second):
			}
			continue
		}
		logger.Printf("dhcp: udhcpc pid %d on %s", pid, iface)
		select {
		case ws := <-ch:
			logger.Printf("dhcp: udhcpc exited (%v); restarting", ws.ExitStatus())
		case <-stop:
			syscall.Kill(pid, syscall.SIGTERM)
			<-ch
			logger.Printf("dhcp: udhcpc stopped")
			return
		}
		select {
		case <-stop:
			return
		case <-time.After(time.Second):
		}
	}
}

// run runs argv to its end (output to the console) and returns its error.
func (r *reaper) run(argv ...string) error {
	_, ch, err := r.start(argv, []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"})
	if err != nil {
		return err
	}
	if ws := <-ch; ws.ExitStatus() != 0 || ws.Signaled() {
		return fmt.Errorf("%s: exit status %d", strings.Join(argv, " "), ws.ExitStatus())
	}
	return nil
}

// readSeedFromDisks mounts each candidate device read-only (iso9660, then
// vfat) on mnt and reads the seed from the first that has a meta-data file.
func readSeedFromDisks(devRoot, mnt string, logger *log.Logger) (*Seed, error) {
	os.MkdirAll(mnt, 0o755)
	var errs []string
	for _, dev := range CandidateDisks(devRoot) {
		for _, fs := range []string{"iso9660", "vfat"} {
			if err := syscall.Mount(dev, mnt, fs, syscall.MS_RDONLY, ""); err != nil {
				continue
			}
			s, err := ReadSeedDir(mnt)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", dev, err))
				syscall.Unmount(mnt, 0)
				continue
			}
			s.Source = dev
			// Keep the seed mounted so it can be inspected from the console.
			return s, nil
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("no seed device found")
	}
	return nil, errors.New(strings.Join(errs, "; "))
}

// firstEthernet returns the first interface that is not loopback.
func firstEthernet() string {
	ents, _ := os.ReadDir("/sys/class/net")
	for _, e := range ents {
		if e.Name() != "lo" {
			return e.Name()
		}
	}
	return ""
}

// sysFinitModule is finit_module(2) on amd64 (the only architecture the test
// guest is built for; the syscall package does not name it).
const sysFinitModule = 313
