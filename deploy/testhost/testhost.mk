# Test host targets (included by the main Makefile). Run as root; see deploy/testhost/README.md.
.PHONY: testhost testhost-down testguest testhost-smoke

testhost: ## set up or repair the test host (netns pftest, libvirtd, sshd, pool, network, guest); writes .testhost/env
	bash deploy/testhost/up.sh

testhost-down: ## remove the test host (keeps .testhost/guest; TESTHOST_DOWN_FLAGS=--all removes it too)
	bash deploy/testhost/down.sh $(TESTHOST_DOWN_FLAGS)

testguest: ## build the test guest into .testhost/guest (vmlinuz, initrd.img, disk.raw, sha256s)
	bash deploy/testhost/build-guest.sh

testhost-smoke: ## boot one test guest and check lease, agent, proxy, seed, control API and ssh
	bash deploy/testhost/smoke.sh
