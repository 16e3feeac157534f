// The tests' helpers (tests import nothing from bench/): free ports below the kernel's ephemeral
// range, for gateway processes and peers told theirs before they start.
export { freePort, freeUdpPort } from '../../__tests__/helpers/ports';
