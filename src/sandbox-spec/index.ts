export * from './schema.js';
export * from './maxima.js';
export * from './parse.js';
export * from './units.js';
export * from './loosenings.js';
