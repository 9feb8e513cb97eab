// Command testguest is proxyfleet's test guest: a static program that runs as
// /init in a busybox initramfs under direct kernel boot. It loads the virtio
// modules, reads its NoCloud seed, configures its NIC from the seed's
// network-config (static addresses and routes, busybox ip; netconfig.go) or
// without one takes a DHCP lease (busybox udhcpc), serves an HTTP forward
// proxy, answers the QEMU guest-agent protocol on the org.qemu.guest_agent.0
// virtio-serial port and serves a control API on :9090 that can stop and
// start the proxy and the agent.
//
// The proxy stands in for the squid that proxyfleet's user-data installs in a
// Debian guest: it reads /etc/squid/squid.conf (and the password file it names)
// from the seed's cloud-config write_files and emulates the subset proxyfleet
// writes (http_port, basic auth, src/dst/proxy_auth acls, http_access,
// forwarded_for, via, header_access; squid.go). It listens only once the seed
// is read; without a squid.conf it is an open proxy on -proxy-addr (:3128)
// that adds no header, and a squid.conf it cannot honour keeps it closed.
//
// Outside a VM (not PID 1) it runs only the proxy, the control API and,
// with -seed-dir, a seed read from a directory; this is for local checks.
package main
