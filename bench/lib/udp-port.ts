// The tests' helper (tests import nothing from bench/); bench:gateways finds its peers' ports with it too.
export { freeUdpPort } from '../../__tests__/helpers/udp';
