'use strict';
// Rules: timers are kept in one FIFO list per delay; the loop takes the list
// whose first timer is due earliest and runs every due timer of that list, in
// insertion order, before it looks at another list. So C (10 ms, armed 2 ms
// after A) runs right after A, before B (9 ms, armed with C), though B's
// deadline is 1 ms earlier than C's.
const log = (s) => console.log(s);
const busy = (ms) => { const end = Date.now() + ms; while (Date.now() < end); };

setTimeout(() => log('A-d10'), 10);
busy(2);
setTimeout(() => log('C-d10'), 10);
setTimeout(() => log('B-d9'), 9);
busy(20);
