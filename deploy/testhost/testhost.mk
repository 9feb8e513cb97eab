# Test host targets (included by the main Makefile). Run as root.
#   make testhost        set up (or repair) the test host; writes .testhost/env
#   make testhost-down   remove it (keeps the built guest; TESTHOST_DOWN_FLAGS=--all removes it too)
#   make testguest       build only the test guest (.testhost/guest/)
#   make testhost-smoke  boot a real guest and check lease, agent, proxy, seed, ssh
.PHONY: testhost testhost-down testguest testhost-smoke

testhost:
	bash deploy/testhost/up.sh

testhost-down:
	bash deploy/testhost/down.sh $(TESTHOST_DOWN_FLAGS)

testguest:
	bash deploy/testhost/build-guest.sh

testhost-smoke:
	bash deploy/testhost/smoke.sh
