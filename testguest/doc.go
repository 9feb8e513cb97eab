// Command testguest is proxyfleet's test guest: a static program that runs as
// /init in a busybox initramfs under direct kernel boot. It loads the virtio
// modules, takes a DHCP lease (busybox udhcpc), reads its NoCloud seed, serves
// an HTTP forward proxy on :3128, answers the QEMU guest-agent protocol on the
// org.qemu.guest_agent.0 virtio-serial port and serves a control API on :9090
// that can stop and start the proxy and the agent.
//
// Outside a VM (not PID 1) it runs only the proxy, the control API and,
// with -seed-dir, a seed read from a directory; this is for local checks.
package main
