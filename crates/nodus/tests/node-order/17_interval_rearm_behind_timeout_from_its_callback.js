'use strict';
// Rules: an interval is re-armed when its callback returns, appended to its
// delay's list, so a timeout of the same delay that the callback armed fires
// before the interval's next run, although the interval counts from its
// callback's start (`interval1, timeout-from-interval, interval2, ...`).
const log = (s) => console.log(s);

let n = 0;
const iv = setInterval(() => {
  n += 1;
  log('interval' + n);
  if (n === 1) setTimeout(() => log('timeout-from-interval'), 10);
  if (n === 3) clearInterval(iv);
}, 10);
